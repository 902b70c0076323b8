/*
 * window.h -- process-wide windows and their counts (window.c), and the
 * Window type behind allocconf.expandable_segments() and ipc_safe()
 * (window_type.c), which opens windows of either scope.
 */
#ifndef ALLOCCONF_WINDOW_H
#define ALLOCCONF_WINDOW_H

#include "state/state.h"

/* The spec of allocconf._C.Window, made a type at module exec
 * (window_type.c). */
extern PyType_Spec ac_window_spec;

/* Open (enter=1) or close (enter=0) a window holding expandable segments
 * at `enabled`.  Returns 0, or -1 with an exception set. */
int ac_window(ac_state *st, int enabled, int enter);

#endif /* ALLOCCONF_WINDOW_H */
