/*
 * cuda.h -- questions to the CUDA driver and the kernel, asked on demand.
 *
 * libcuda.so.1 is opened with dlopen when a question is asked, never at
 * import and never linked at build time; without it the answers say "no
 * CUDA driver" instead of failing.
 */
#ifndef ALLOCCONF_CUDA_H
#define ALLOCCONF_CUDA_H

#include "compat.h"

/* A new dict describing the driver and its devices, or NULL. */
PyObject *cu_driver_info(void);

/* 1 when the allocation holding device pointer `ptr` can go through
 * cudaIpcGetMemHandle, 0 when not, -1 with RuntimeError set when the
 * driver cannot say (no driver, not a device pointer). */
int cu_pointer_ipc_capable(unsigned long long ptr);

/* A new dict with the pidfd probe's result, or NULL. */
PyObject *cu_pidfd_probe(void);

#endif /* ALLOCCONF_CUDA_H */
