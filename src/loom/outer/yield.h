// Idle CPU priority for an async island that is ahead of its period.
//
// An async island that has pushed trains on from its own parameters until its Delayed Nesterov
// period closes; the rebase keeps those steps, though they start from parameters a period old.
// Where islands share cores (several on one machine, or beside other work), each such step also
// takes a core from an island still on its way to the beat, so the period closes later and the
// next island to push trains longer on old parameters in turn. Between a push and taking its
// period, the island's compute threads therefore run at idle CPU priority (Linux SCHED_IDLE): they
// get whatever no other thread wants (all of it on a machine of its own) and never block.
#pragma once

namespace loom::outer {

// Whether a thread of this process may leave SCHED_IDLE again (root, CAP_SYS_NICE, or an
// RLIMIT_NICE that allows its nice value): probed once, on a thread of its own, so a process that
// may not never sets it.
bool can_idle();

// The calling thread and OpenMP's team at SCHED_IDLE (true) or back at SCHED_OTHER (false). Does
// nothing and returns false where can_idle() is false; throws loom::Error when the scheduler
// refuses a change it allowed the probe.
bool set_compute_idle(bool idle);

}  // namespace loom::outer
