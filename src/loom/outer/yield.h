// Idle CPU priority for an async island that is ahead of its period.
//
// An async island that has pushed trains on from its own parameters until its Delayed Nesterov
// period closes; the rebase keeps those steps, though they start from parameters a period old.
// Where islands share cores (several on one machine), each such step also takes a core from an
// island still on its way to the beat, so the period closes later and the islands that pushed
// first train longer on old parameters. While it is ahead, the island's inner steps therefore run
// at idle CPU priority (Linux SCHED_IDLE): a core another runnable thread of the same scheduling
// group wants goes to that thread (SCHED_IDLE weighs 3 against a nice-0 thread's 1024); a core of
// its own it keeps. The island never blocks.
#pragma once

namespace loom::outer {

// Whether this process may yield: its calling thread runs SCHED_OTHER or SCHED_BATCH, and a thread
// may leave SCHED_IDLE again (CAP_SYS_NICE, or an RLIMIT_NICE of at least 20 - its nice value).
// Probed once, on a thread of its own (the first call's), so a process that may not never sets
// it.
bool can_idle();

// The calling thread and OpenMP's team at SCHED_IDLE. Returns false, changing nothing, where
// can_idle() is false or an earlier change failed (it says why on stderr, once).
bool set_compute_idle();

// Every thread of the process at SCHED_IDLE (those set_compute_idle() set, and any made by them
// meanwhile, which inherit it) back at the policy the process had. Failures: as above.
void restore_compute();

}  // namespace loom::outer
