/*
 * alloc.h -- classic device memory for torch's pluggable allocator: the
 * two functions a torch.cuda.MemPool of allocconf's calls, exported from
 * the extension's own file, and what they hold.
 *
 * torch loads them by name (torch.cuda.memory.CUDAPluggableAllocator
 * opens allocconf._C's file and looks up AC_POOL_MALLOC and AC_POOL_FREE)
 * and calls them from any thread, without the GIL, with no pointer back
 * to the module state: so what they use is process-wide by nature, a
 * driver table loaded once and the bytes they hold, kept in atomics.
 */
#ifndef ALLOCCONF_ALLOC_H
#define ALLOCCONF_ALLOC_H

#include "compat.h"

#include <stddef.h>

/* The names torch looks the two functions up by. */
#define AC_POOL_MALLOC "allocconf_pool_malloc"
#define AC_POOL_FREE "allocconf_pool_free"

/* The most devices the byte counts and the route know; a process that
 * sees more routes the first AC_MAX_DEVICES. */
#define AC_MAX_DEVICES 64

#if defined(__GNUC__) || defined(__clang__)
#define AC_EXPORT __attribute__((visibility("default")))
#else
#define AC_EXPORT
#endif

/* torch's signatures (c10/cuda/CUDAPluggableAllocator): the stream is a
 * cudaStream_t, a pointer, unused here (classic memory is not stream
 * ordered).  malloc returns NULL when the driver has no memory to give. */
AC_EXPORT void *allocconf_pool_malloc(size_t size, int device, void *stream);
AC_EXPORT void allocconf_pool_free(void *ptr, size_t size, int device,
                                   void *stream);

/* The bytes the two functions hold, on all devices (allocated, not
 * freed): memory of a pool release_pools() ended stays counted until
 * it is freed. */
size_t cu_pool_bytes(void);

/* The devices whose primary context is active (torch has used them), as
 * a bit mask of the first AC_MAX_DEVICES, asked of the driver without
 * making a context: 0 when there is no driver or it is not initialised.
 * Ask only once CUDA is up (the driver is loaded then).  Never sets an
 * exception. */
unsigned long long cu_active_devices(void);

#endif /* ALLOCCONF_ALLOC_H */
