/* The math functions a ward runtime plugin may call. */
#ifndef WARD_RT_MATH_H
#define WARD_RT_MATH_H
double sqrt(double x);
float sqrtf(float x);
double floor(double x);
double ceil(double x);
double fabs(double x);
double round(double x);
double sin(double x);
double cos(double x);
double tan(double x);
double exp(double x);
double log(double x);
double log2(double x);
double log10(double x);
double pow(double x, double y);
double fmin(double x, double y);
double fmax(double x, double y);
#endif
