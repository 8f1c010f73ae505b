/*
 * calls_plugin.c -- the built-in calls extension without calls_via and its
 * dlopen: the plugin a stand-in class adapter (calls itself) opens, which an
 * mpk domain can hold (a library an adapter opens may open nothing itself).
 */
#define CALLS_NO_DLOPEN 1
#include "calls.c"
