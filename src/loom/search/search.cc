#include "loom/search/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/passes/pipeline.h"
#include "loom/search/predict.h"
#include "loom/train/compile.h"

namespace loom::search {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Evaluator::Evaluator(train::Config cfg, std::shared_ptr<const sim::Cluster> cluster,
                     int64_t devices)
    : cfg_(std::move(cfg)), cluster_(std::move(cluster)), devices_(devices) {
  train::Config plain = cfg_;
  plain.plan.plan = shard::Plan{};
  trained_ =
      passes::compile(train::step_options(plain, passes::StepKind::train, 0), passes::Stage::train);
}

const Evaluation* Evaluator::find(const Candidate& c) const {
  auto it = done_.find(c.key());
  return it == done_.end() ? nullptr : &it->second;
}

const Evaluation& Evaluator::evaluate(const Candidate& c) {
  const std::string key = c.key();
  if (auto it = done_.find(key); it != done_.end()) return it->second;
  const auto t0 = Clock::now();
  Evaluation e;
  e.candidate = c;
  e.index = int64_t(done_.size());
  train::Config cfg = cfg_;
  c.apply(cfg);
  try {
    e.figures = predict(cfg, cluster_, devices_, key, nullptr, &trained_);
    e.ok = true;
    e.step_s = e.figures["step_ms"].get<double>() / 1e3;
    e.peak_bytes = e.figures["peak_bytes"].get<int64_t>();
    e.fits = e.figures["fits"].get<bool>();
  } catch (const Error& err) {
    e.error = err.what();
  }
  e.seconds = seconds_since(t0);
  return done_.emplace(key, std::move(e)).first->second;
}

std::vector<const Evaluation*> Evaluator::ranked() const {
  std::vector<const Evaluation*> r;
  for (const auto& [k, e] : done_) r.push_back(&e);
  std::stable_sort(r.begin(), r.end(), [](const Evaluation* a, const Evaluation* b) {
    const bool fa = a->ok && a->fits, fb = b->ok && b->fits;
    if (fa != fb) return fa;
    if (fa) return a->step_s < b->step_s;
    if (a->ok != b->ok) return a->ok;
    return a->peak_bytes < b->peak_bytes;
  });
  return r;
}

namespace {

struct TreeNode {
  std::vector<int> prefix;
  std::vector<int> opts;  // empty: a complete candidate (or a dead end)
  std::vector<std::unique_ptr<TreeNode>> kids;
  int64_t visits = 0;
  double sum = 0, best = 0;  // of the rewards below
  bool closed = false;       // every candidate below evaluated (or none exists)
};

class Mcts {
 public:
  Mcts(const Space& s, Evaluator& ev, const SearchOptions& o)
      : s_(s), ev_(ev), o_(o), rng_(o.seed) {
    root_ = make({});
  }

  SearchResult run() {
    const auto t0 = Clock::now();
    const int64_t before = ev_.evaluations();
    SearchResult r;
    // an iteration that only reaches evaluated candidates costs no evaluation; bound them
    const int64_t max_idle = 10000;
    int64_t idle = 0;
    // the tree's share of the budget; the rest goes to the local search
    const double tree = 1 - o_.local_share;
    auto left = [&](double share) {
      return seconds_since(t0) < share * o_.budget_s &&
             (o_.max_evaluations <= 0 ||
              double(ev_.evaluations() - before) < share * double(o_.max_evaluations));
    };
    auto grow = [&](double share) {
      while (!root_->closed && left(share) && idle < max_idle) {
        const int64_t n = ev_.evaluations();
        iterate();
        ++r.iterations;
        idle = ev_.evaluations() == n ? idle + 1 : 0;
      }
    };
    grow(tree);
    if (!root_->closed) local_search([&] { return left(1.0); });
    grow(1.0);  // the climb reached a plan none of whose neighbours is faster: back to the tree
    r.evaluations = ev_.evaluations() - before;
    r.exhausted = root_->closed;
    r.seconds = seconds_since(t0);
    return r;
  }

 private:
  // Hill climbing from the best candidate found: its neighbours (Space::neighbours: one decision
  // changed, two axes swapped or merged) are evaluated in turn, moving to the first that is
  // faster, until none is left unevaluated or `more` says the budget is spent.
  template <class More>
  void local_search(More more) {
    for (bool moved = true; moved && more();) {
      moved = false;
      const std::vector<int>* best = nullptr;
      double reward = 0;
      for (const auto& [key, d] : decisions_)
        if (const Evaluation* e = ev_.find(s_.candidate(d)); e && e->reward() > reward)
          reward = e->reward(), best = &d;
      if (!best) return;
      for (std::vector<int>& d : s_.neighbours(*best)) {
        const Candidate c = s_.candidate(d);
        if (ev_.find(c)) continue;
        if (!more()) return;
        decisions_[c.key()] = std::move(d);
        const double got = ev_.evaluate(c).reward();
        best_ = std::max(best_, got);
        if (got > reward) {
          moved = true;
          break;
        }
      }
    }
  }

  std::unique_ptr<TreeNode> make(std::vector<int> prefix) {
    auto n = std::make_unique<TreeNode>();
    n->prefix = std::move(prefix);
    n->opts = s_.options(n->prefix);
    n->kids.resize(n->opts.size());
    return n;
  }

  double score(const TreeNode& parent, const TreeNode& kid) const {
    const double q = best_ > 0 ? (kid.sum / double(kid.visits) + kid.best) / 2 / best_ : 0;
    return q + kExplore * std::sqrt(std::log(double(parent.visits)) / double(kid.visits));
  }

  void iterate() {
    std::vector<TreeNode*> path{root_.get()};
    TreeNode* node = root_.get();
    while (!node->opts.empty()) {
      std::vector<size_t> untried;
      for (size_t i = 0; i < node->kids.size(); ++i)
        if (!node->kids[i]) untried.push_back(i);
      if (!untried.empty()) {
        const size_t i = untried[rng_() % untried.size()];
        std::vector<int> p = node->prefix;
        p.push_back(node->opts[i]);
        node->kids[i] = make(std::move(p));
        node = node->kids[i].get();
        path.push_back(node);
        break;
      }
      TreeNode* pick = nullptr;
      double best = -1;
      for (auto& k : node->kids)
        if (!k->closed) {
          const double sc = k->visits ? score(*node, *k) : 1e300;
          if (sc > best) best = sc, pick = k.get();
        }
      LOOM_CHECK(pick) << "plan search: an open node with every child closed";
      node = pick;
      path.push_back(node);
    }
    // rollout: random decisions to a complete candidate
    std::vector<int> p = node->prefix;
    double reward = 0;
    for (;;) {
      if (s_.complete(p)) {
        const Candidate c = s_.candidate(p);
        decisions_.emplace(c.key(), p);
        reward = ev_.evaluate(c).reward();
        break;
      }
      const std::vector<int> opts = s_.options(p);
      if (opts.empty()) break;  // a dead end: no candidate below
      p.push_back(opts[rng_() % opts.size()]);
    }
    best_ = std::max(best_, reward);
    if (node->opts.empty()) node->closed = true;  // a candidate (evaluated) or a dead end
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      TreeNode* n = *it;
      ++n->visits;
      n->sum += reward;
      n->best = std::max(n->best, reward);
      if (!n->opts.empty())
        n->closed = std::all_of(n->kids.begin(), n->kids.end(),
                                [](const auto& k) { return k && k->closed; });
    }
  }

  static constexpr double kExplore = 0.7071067811865476;
  const Space& s_;
  Evaluator& ev_;
  SearchOptions o_;
  std::mt19937_64 rng_;
  std::unique_ptr<TreeNode> root_;
  double best_ = 0;                                    // the best reward seen
  std::map<std::string, std::vector<int>> decisions_;  // evaluated candidate -> its decisions
};

}  // namespace

SearchResult search(const Space& space, Evaluator& ev, const SearchOptions& o) {
  if (!(o.budget_s > 0))
    throw Error(fmt::format("plan search: a budget of {} seconds", o.budget_s),
                "give --budget a positive number of seconds");
  SearchResult r;
  if (o.exhaustive) {
    const auto t0 = Clock::now();
    const int64_t before = ev.evaluations();
    const auto all = space.enumerate();
    size_t i = 0;
    for (; i < all.size() && seconds_since(t0) < o.budget_s; ++i)
      ev.evaluate(space.candidate(all[i]));
    r.evaluations = ev.evaluations() - before;
    r.exhausted = i == all.size();
    r.seconds = seconds_since(t0);
    r.iterations = int64_t(i);
  } else {
    r = Mcts(space, ev, o).run();
  }
  const auto ranked = ev.ranked();
  if (!ranked.empty() && ranked.front()->ok && ranked.front()->fits) {
    r.best = ranked.front();
    r.best_at = r.best->index + 1;
  } else {
    for (const Evaluation* e : ranked)
      if (e->ok) {
        r.closest = e;
        break;
      }
  }
  return r;
}

}  // namespace loom::search
