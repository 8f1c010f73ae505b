/* The few stdlib.h functions a ward runtime plugin may call: pure ones (no allocation: the runtime's heap is
 * ward_heap(), see ward_runtime.h). */
#ifndef WARD_RT_STDLIB_H
#define WARD_RT_STDLIB_H
#include <stddef.h>
int abs(int x);
long labs(long x);
long long llabs(long long x);
#endif
