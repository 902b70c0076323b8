/*
 * environ.h -- reading the variables torch reads (PYTORCH_*_ALLOC_CONF)
 * and allocconf's own (ALLOCCONF_AUTO, ALLOCCONF_DEBUG).
 */
#ifndef ALLOCCONF_ENVIRON_H
#define ALLOCCONF_ENVIRON_H

#include "state/state.h"

/* The variables torch may read, in its order (environ.c says which torch
 * reads which), and the bits of ac_state.reads naming them. */
enum { AC_N_ENV_VARS = 3 };
extern const char *const ac_env_vars[AC_N_ENV_VARS];
#define AC_READS_CUDA 1u
#define AC_READS_HIP 2u
#define AC_READS_ALLOC 4u
#define AC_READS_ALL 7u
/* The bits above the first three: the variables the CUDA allocator's own
 * configuration reads (backend, CUDA-only keys), which can differ. */
#define AC_READS_BACKEND(reads) (((reads) >> 3) & AC_READS_ALL)

/* The variables a torch reads, by capability: for expandable_segments and
 * the generic keys, all three where it has
 * torch._C._accelerator_setAllocatorSettings (`generic`, 2.10+), else the
 * CUDA one and, on a ROCm build (`rocm`), the HIP one; for the backend
 * (AC_READS_BACKEND), the CUDA one, the HIP one on ROCm, and with
 * `generic` PYTORCH_ALLOC_CONF. */
unsigned ac_env_reads(int rocm, int generic);

/* What st->reads says, all of them before torch has been seen. */
unsigned ac_env_reads_of(const ac_state *st);

/* The index of the first variable of `reads` that is set, or -1. */
int ac_env_first(unsigned reads);

/* Bring st->opt_out up to date with the environment and st->reads,
 * rebuilding the strings and adding a warning text to `warnings` when it
 * changed.  Lock held.  1 when it changed, 0 when not, -1 with an
 * exception set. */
int ac_env_opt_out_locked(ac_state *st, PyObject *warnings);

/* A new tuple of the variables allocconf reads (bytes, None where unset),
 * to notice a change made before torch was imported. */
PyObject *ac_env_snapshot(void);

/* Read the environment into the state, lock held.  0, or -1 with an
 * exception set; problems with the user's strings become warning texts
 * in the list `warnings`, never exceptions. */
int ac_load_locked(ac_state *st, PyObject *warnings);

/* Take what the imported torch reads (ac_env_reads; `generic`: it has the
 * 2.10 setter), and so which sticky keys it knows.  Lock held. */
void ac_env_set_reads_locked(ac_state *st, unsigned reads, int generic);

/* ac_load_locked under the lock, for a torch already imported that reads
 * `reads` (ac_env_reads; `generic`: it has the 2.10 setter), or for one
 * not imported yet when `reads` is 0.  A new list of warning texts, or
 * NULL. */
PyObject *ac_load_environ(ac_state *st, unsigned reads, int generic);

#endif /* ALLOCCONF_ENVIRON_H */
