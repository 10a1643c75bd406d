// [passes]: what the scheduled stage does to a per-rank program (ScheduleOptions, pass.h). Its
// check loads [passes] cluster when bucket = "auto" needs it.
#pragma once

#include "loom/config/fwd.h"
#include "loom/passes/pass.h"

namespace loom::passes {

const config::Section<ScheduleOptions>& passes_section();

}  // namespace loom::passes
