/* bool for a ward runtime plugin. */
#ifndef WARD_RT_STDBOOL_H
#define WARD_RT_STDBOOL_H
#define bool _Bool
#define true 1
#define false 0
#endif
