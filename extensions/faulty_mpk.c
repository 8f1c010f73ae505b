/*
 * faulty_mpk.c -- the deliberately faulty built-in extension as an mpk domain
 * can hold it: faulty.c without the kinds that need a process of their own
 * (leaking descriptors, raising SIGKILL, attacking a process domain's rings)
 * and without their imports. Kind numbers and entry points are faulty.c's.
 */
#define FAULTY_IN_PROCESS 1
#include "faulty.c"
