/* placeholder: replaced by the frei0r adapter */
#include <stdint.h>
__attribute__((visibility("default"))) int64_t ward_frei0r_placeholder(void) { return 0; }
