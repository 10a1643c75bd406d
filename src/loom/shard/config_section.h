// [plan]'s split: `mesh = { data = 2, model = 2 }` and `tactics = [ { kind, axis }, ... ]`
// (plan.h), checked against the tactic table (tactic.h) as they are read.
#pragma once

#include "loom/config/fwd.h"
#include "loom/shard/plan.h"

namespace loom::shard {

// Section "plan" over a Plan; train/config.cc adds its `ranks` key. Its check: tactics need a mesh.
const config::Section<Plan>& plan_section();

}  // namespace loom::shard
