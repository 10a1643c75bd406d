#include "loom/search/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

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

Evaluation Evaluator::compute(const Candidate& c) const {
  const auto t0 = Clock::now();
  Evaluation e;
  e.candidate = c;
  train::Config cfg = cfg_;
  c.apply(cfg);
  try {
    e.figures = predict(cfg, cluster_, devices_, c.key(), nullptr, &trained_);
    e.ok = true;
    e.step_s = e.figures["step_ms"].get<double>() / 1e3;
    e.peak_bytes = e.figures["peak_bytes"].get<int64_t>();
    e.fits = e.figures["fits"].get<bool>();
  } catch (const Error& err) {
    e.error = err.what();
  }
  e.seconds = seconds_since(t0);
  return e;
}

const Evaluation& Evaluator::record(Evaluation e) {
  const std::string key = e.candidate.key();
  if (auto it = done_.find(key); it != done_.end()) return it->second;
  e.index = int64_t(done_.size());
  return done_.emplace(key, std::move(e)).first->second;
}

const Evaluation& Evaluator::evaluate(const Candidate& c) {
  if (const Evaluation* e = find(c)) return *e;
  return record(compute(c));
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

// Evaluations on worker threads: candidates go in, evaluations come out as they end. With one
// job there is no thread: take() evaluates on the caller's.
class Pool {
 public:
  Pool(const Evaluator& ev, int jobs) : ev_(ev) {
    if (jobs > 1)
      for (int i = 0; i < jobs; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void submit(Candidate c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      todo_.push_back(std::move(c));
      ++in_flight_;
    }
    work_.notify_one();
  }
  // The next evaluation to end (one must be in flight); an evaluation's own failure (not a
  // loom::Error, which is the candidate's verdict) is rethrown here.
  Evaluation take() {
    std::unique_lock<std::mutex> lock(mu_);
    LOOM_CHECK(in_flight_ > 0) << "plan search: waiting for no evaluation";
    if (threads_.empty()) {
      Candidate c = std::move(todo_.front());
      todo_.pop_front();
      --in_flight_;
      lock.unlock();
      return ev_.compute(c);
    }
    done_cv_.wait(lock, [&] { return !done_.empty(); });
    Result r = std::move(done_.front());
    done_.pop_front();
    --in_flight_;
    if (r.failure) std::rethrow_exception(r.failure);
    return std::move(r.e);
  }
  int64_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }

 private:
  struct Result {
    Evaluation e;
    std::exception_ptr failure;
  };
  void work() {
    for (;;) {
      Candidate c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (stop_) return;  // what is queued is dropped: no one will take it
        c = std::move(todo_.front());
        todo_.pop_front();
      }
      Result r;
      try {
        r.e = ev_.compute(c);
      } catch (...) {
        r.failure = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back(std::move(r));
      }
      done_cv_.notify_one();
    }
  }

  const Evaluator& ev_;
  mutable std::mutex mu_;
  std::condition_variable work_, done_cv_;
  std::deque<Candidate> todo_;
  std::deque<Result> done_;
  int64_t in_flight_ = 0;  // submitted, not taken
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

struct TreeNode {
  std::vector<int> prefix;
  std::vector<int> opts;  // empty: a complete candidate (or a dead end)
  std::vector<std::unique_ptr<TreeNode>> kids;
  int64_t visits = 0;
  double sum = 0, best = 0;  // of the rewards below
  bool closed = false;       // every candidate below evaluated (or in flight, or none exists)
};

class Mcts {
 public:
  Mcts(const Space& s, Evaluator& ev, const SearchOptions& o)
      : s_(s), ev_(ev), o_(o), rng_(o.seed), pool_(ev, std::max(1, o.jobs)) {
    root_ = make({});
  }

  SearchResult run() {
    const auto t0 = Clock::now();
    before_ = ev_.evaluations();
    SearchResult r;
    // an iteration that only reaches evaluated candidates costs no evaluation; bound them
    const int64_t max_idle = 10000;
    int64_t idle = 0;
    // the tree's share of the budget; the rest goes to the local search
    const double tree = 1 - o_.local_share;
    auto left = [&](double share) {
      return seconds_since(t0) < share * o_.budget_s &&
             (o_.max_evaluations <= 0 || double(started()) < share * double(o_.max_evaluations));
    };
    const int64_t jobs = std::max(1, o_.jobs);
    auto grow = [&](double share) {
      for (;;) {
        while (pool_.in_flight() < jobs && !root_->closed && left(share) && idle < max_idle) {
          const int64_t n = started();
          start_rollout();
          ++r.iterations;
          idle = started() == n ? idle + 1 : 0;
        }
        if (pool_.in_flight() == 0) break;
        end_rollout();
        idle = 0;  // rollouts that reached only candidates in flight may find others now
      }
    };
    grow(tree);
    if (!root_->closed) local_search([&] { return left(1.0); });
    grow(1.0);  // the climb reached a plan none of whose neighbours is faster: back to the tree
    r.evaluations = ev_.evaluations() - before_;
    r.exhausted = root_->closed;
    r.seconds = seconds_since(t0);
    return r;
  }

 private:
  // evaluations this search started: recorded, and in flight
  int64_t started() const { return ev_.evaluations() - before_ + pool_.in_flight(); }

  // Hill climbing from the best candidate found: its neighbours (Space::neighbours: one decision
  // changed, two axes swapped or merged) are evaluated in turn, `jobs` at a time, moving to the
  // fastest of them that improves, until none is left unevaluated or `more` says the budget is
  // spent.
  template <class More>
  void local_search(More more) {
    const size_t jobs = size_t(std::max(1, o_.jobs));
    for (bool moved = true; moved && more();) {
      moved = false;
      const std::vector<int>* best = nullptr;
      double reward = 0;
      for (const auto& [key, d] : decisions_)
        if (const Evaluation* e = ev_.find(s_.candidate(d)); e && e->reward() > reward)
          reward = e->reward(), best = &d;
      if (!best) return;
      std::vector<std::vector<int>> next = s_.neighbours(*best);
      std::erase_if(next, [&](const std::vector<int>& d) { return ev_.find(s_.candidate(d)); });
      for (size_t i = 0; i < next.size() && !moved;) {
        size_t sent = 0;
        for (; sent < jobs && i < next.size() && more(); ++i, ++sent) {
          const Candidate c = s_.candidate(next[i]);
          decisions_[c.key()] = next[i];
          pool_.submit(c);
        }
        if (sent == 0) return;  // the budget is spent
        for (; sent > 0; --sent) {
          const double got = ev_.record(pool_.take()).reward();
          best_ = std::max(best_, got);
          moved = moved || got > reward;
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

  // One iteration's first half: down the tree, one node expanded, a random rollout to a complete
  // candidate. Every node on the path counts the visit now; the reward follows when the
  // candidate's evaluation ends (end_rollout), at once where it was evaluated before, and never
  // for a dead end (reward 0).
  void start_rollout() {
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
    std::optional<Candidate> c;
    for (;;) {
      if (s_.complete(p)) {
        c = s_.candidate(p);
        decisions_.emplace(c->key(), p);
        break;
      }
      const std::vector<int> opts = s_.options(p);
      if (opts.empty()) break;  // a dead end: no candidate below
      p.push_back(opts[rng_() % opts.size()]);
    }
    if (node->opts.empty()) node->closed = true;  // a candidate (evaluated) or a dead end
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      TreeNode* n = *it;
      ++n->visits;
      if (!n->opts.empty())
        n->closed = std::all_of(n->kids.begin(), n->kids.end(),
                                [](const auto& k) { return k && k->closed; });
    }
    if (!c) return;
    if (const Evaluation* e = ev_.find(*c)) return reward(path, e->reward());
    auto [it, fresh] = flying_.try_emplace(c->key());
    it->second.push_back(std::move(path));
    if (fresh) pool_.submit(*c);
  }

  // One iteration's second half: the next evaluation to end, its reward to every path that
  // reached it.
  void end_rollout() {
    const Evaluation& e = ev_.record(pool_.take());
    auto it = flying_.find(e.candidate.key());
    LOOM_CHECK(it != flying_.end()) << "plan search: an evaluation no rollout waits for";
    for (const std::vector<TreeNode*>& path : it->second) reward(path, e.reward());
    flying_.erase(it);
  }

  void reward(const std::vector<TreeNode*>& path, double r) {
    best_ = std::max(best_, r);
    for (TreeNode* n : path) {
      n->sum += r;
      n->best = std::max(n->best, r);
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
  // candidates in flight -> the paths of the rollouts that reached them
  std::map<std::string, std::vector<std::vector<TreeNode*>>> flying_;
  int64_t before_ = 0;  // the evaluator's evaluations when the search began
  Pool pool_;           // last: its threads end before what they read
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
    const int jobs = std::max(1, o.jobs);
    Pool pool(ev, jobs);
    size_t i = 0;
    for (;;) {
      for (; i < all.size() && pool.in_flight() < jobs && seconds_since(t0) < o.budget_s; ++i) {
        const Candidate c = space.candidate(all[i]);
        if (!ev.find(c)) pool.submit(c);
      }
      if (pool.in_flight() == 0) break;
      ev.record(pool.take());
    }
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
