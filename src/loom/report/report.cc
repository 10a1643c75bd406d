#include "loom/report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::report {

Metrics read_metrics(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size());
    lines.push_back(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
  }
  auto blank = [](std::string_view s) {
    return s.find_first_not_of(" \t\r") == std::string_view::npos;
  };
  size_t last = lines.size();
  while (last > 0 && blank(lines[last - 1])) --last;  // lines[last-1] is the last non-blank line

  std::vector<Row> rows;
  size_t skipped = 0;
  std::string first_skip;
  struct Skip {
    std::string why;
    bool not_json = false;  // on the last line: a write torn by a crash, dropped silently
  };
  for (size_t i = 0; i < last; ++i) {
    if (blank(lines[i])) continue;
    const std::string where = fmt::format("{}:{}", path, i + 1);
    try {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(lines[i]);
      } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (1e400)
        throw Skip{fmt::format("not JSON: {}", e.what()), true};
      }
      if (!j.is_object()) throw Skip{"not a JSON object"};
      auto number = [&](const char* key, bool required) {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) {
          if (required) throw Skip{fmt::format("no \"{}\"", key)};
          return double(NAN);
        }
        if (!it->is_number())
          throw Skip{fmt::format("\"{}\" is {}, not a number", key, it->dump())};
        return it->get<double>();
      };
      auto st = j.find("step");
      if (st == j.end() || !st->is_number_integer())
        throw Skip{"\"step\" is missing or not an integer"};
      rows.push_back(Row{.step = st->get<int64_t>(),
                         .loss = number("loss", true),
                         .lr = number("lr", false),
                         .grad_norm = number("grad_norm", false),
                         .tokens_per_s = number("tokens_per_s", false),
                         .val_loss = number("val_loss", false),
                         .ce_loss = number("ce_loss", false),
                         .moe_tokens_max = number("moe_tokens_max", false),
                         .moe_tokens_mean = number("moe_tokens_mean", false),
                         .moe_dropped = number("moe_dropped", false)});
    } catch (const Skip& s) {
      if (i + 1 == last && s.not_json) break;
      if (skipped++ == 0) first_skip = fmt::format("{}: {}", where, s.why);
    }
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.step < b.step; });
  Metrics out{.skipped = skipped, .first_skip = std::move(first_skip)};
  for (const Row& r : rows) {
    if (!out.rows.empty() && out.rows.back().step == r.step)
      out.rows.back() = r;
    else
      out.rows.push_back(r);
  }
  return out;
}

namespace {

using Points = std::vector<std::pair<double, double>>;  // (step, value), sorted by step

// Keeps at most `max_points` of `p`: the first and last point, and between them each bucket's
// minimum and maximum in their original order, so spikes survive (a plain stride would drop them).
// Example: 10 points, max_points 6 -> first, last, and 2 buckets of 4 points (indices 1-4, 5-8),
// each contributing its min and max: 6 points.
Points downsample(const Points& p, size_t max_points) {
  if (p.size() <= max_points) return p;
  const size_t inner = p.size() - 2, buckets = (max_points - 2) / 2;
  Points out{p.front()};
  for (size_t b = 0; b < buckets; ++b) {
    size_t i0 = 1 + b * inner / buckets, i1 = 1 + (b + 1) * inner / buckets;
    size_t lo = i0, hi = i0;
    for (size_t i = i0; i < i1; ++i) {
      if (p[i].second < p[lo].second) lo = i;
      if (p[i].second > p[hi].second) hi = i;
    }
    out.push_back(p[std::min(lo, hi)]);
    if (lo != hi) out.push_back(p[std::max(lo, hi)]);
  }
  out.push_back(p.back());
  return out;
}

// A linear axis whose ends and ticks are round numbers (1, 2 or 5 times a power of ten), covering
// the data: Heckbert's "nice numbers", loose labelling. Example: data 1.37..5.52 -> 1, 2, ..., 6.
struct Axis {
  double lo, hi, step;
};

double nice(double x, bool round) {
  double e = std::floor(std::log10(x)), f = x / std::pow(10.0, e), n;
  if (round)
    n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  else
    n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return n * std::pow(10.0, e);
}

// lo and hi are finite and within +-kMaxAbs (svg_plot clamps them), so hi - lo cannot overflow.
Axis nice_axis(double lo, double hi, int ticks, double min_step = 0) {
  if (hi - lo <= std::abs(hi) * 1e-12) {  // a flat series: give it some room
    // (at least 1e-300: a tenth of a denormal would be no room at all)
    double pad = lo == 0 ? 1 : std::max(std::abs(lo) * 0.1, 1e-300);
    lo -= pad;
    hi += pad;
  }
  double step = std::max(nice(nice(hi - lo, false) / (ticks - 1), true), min_step);
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

// Tick labels with just enough digits for the step: "2.5", "12k", "3e-4".
std::string tick_label(double v, const Axis& a) {
  if (std::abs(v) < a.step * 1e-6) return "0";
  const double big = std::max(std::abs(a.lo), std::abs(a.hi));
  auto decimals = [](double step) {  // 0..17: enough for any double's step, never negative
    const double d = -std::floor(std::log10(step) + 1e-9);
    return std::isfinite(d) ? int(std::clamp(d, 0.0, 17.0)) : 0;
  };
  if (big >= 1e4) {
    double div = big >= 1e7 ? 1e6 : 1e3;
    return fmt::format("{:.{}f}{}", v / div, decimals(a.step / div), big >= 1e7 ? "M" : "k");
  }
  if (big < 1e-2) {
    int e = int(std::floor(std::log10(big) + 1e-9));
    double m = std::pow(10.0, e);
    return fmt::format("{:.{}f}e{}", v / m, decimals(a.step / m), e);
  }
  return fmt::format("{:.{}f}", v, decimals(a.step));
}

struct Series {
  std::string name, color;
  Points pts;
  bool markers = false;  // a dot at every point (validation losses, logged every few steps)
};

std::string esc(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr size_t kMaxPoints = 2000;  // per polyline
constexpr double kMaxAbs = 1e300;    // the largest magnitude a plot's axis spans
constexpr double kW = 600, kH = 260, kLeft = 64, kRight = 16, kTop = 30, kBottom = 42;

// One plot as an inline <svg>: frame, grid, round-number ticks, axis titles, a legend when there is
// more than one series, each series a <polyline> (and <circle> markers when asked).
std::string svg_plot(const std::string& title, const std::string& ytitle,
                     std::vector<Series> series, bool include_zero) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (Series& s : series) {
    s.pts = downsample(s.pts, kMaxPoints);
    // values beyond +-1e300 are drawn at the edge (an axis spanning +-1.7e308 overflows)
    for (auto& [x, y] : s.pts) y = std::clamp(y, -kMaxAbs, kMaxAbs);
    for (auto [x, y] : s.pts) {
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" "
      "height=\"{1}\" role=\"img\" aria-label=\"{2}\">\n"
      "<text x=\"{3}\" y=\"18\" class=\"title\">{2}</text>\n",
      kW, kH, esc(title), kLeft);
  const double px0 = kLeft, px1 = kW - kRight, py0 = kTop, py1 = kH - kBottom;
  if (!std::isfinite(xmin)) {
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", px0,
                     py0, px1 - px0, py1 - py0);
    o += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"none\">not logged"
        "</text>\n</svg>\n",
        (px0 + px1) / 2, (py0 + py1) / 2);
    return o;
  }
  if (include_zero) ymin = std::min(ymin, 0.0), ymax = std::max(ymax, 0.0);
  const Axis ax = nice_axis(xmin, xmax, 6, 1), ay = nice_axis(ymin, ymax, 5);
  auto X = [&](double x) { return px0 + (x - ax.lo) / (ax.hi - ax.lo) * (px1 - px0); };
  auto Y = [&](double y) { return py1 - (y - ay.lo) / (ay.hi - ay.lo) * (py1 - py0); };

  // grid and tick labels; ticks are counted, not accumulated, so rounding cannot add or drop one
  const int nx = int(std::lround((ax.hi - ax.lo) / ax.step)),
            ny = int(std::lround((ay.hi - ay.lo) / ay.step));
  for (int i = 0; i <= nx; ++i) {
    double v = ax.lo + i * ax.step, x = X(v);
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" class=\"grid\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, py0, py1 + 4, py1 + 16, tick_label(v, ax));
  }
  for (int i = 0; i <= ny; ++i) {
    double v = ay.lo + i * ay.step, y = Y(v);
    o += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" class=\"grid\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        px0 - 4, y, px1, px0 - 7, y + 4, tick_label(v, ay));
  }
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", px0,
                   py0, px1 - px0, py1 - py0);
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"axis\">step</text>\n",
                   (px0 + px1) / 2, kH - 8);
  o += fmt::format(
      "<text transform=\"translate(14 {}) rotate(-90)\" text-anchor=\"middle\" "
      "class=\"axis\">{}</text>\n",
      (py0 + py1) / 2, esc(ytitle));

  for (const Series& s : series) {
    if (s.pts.empty()) continue;
    std::string pts;
    for (auto [x, y] : s.pts) pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
    pts.pop_back();
    o += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
        "stroke-linejoin=\"round\" points=\"{}\"/>\n",
        s.color, pts);
    if (s.markers)
      for (auto [x, y] : s.pts)
        o += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"><title>step {}: "
            "{:.4f}</title></circle>\n",
            X(x), Y(y), s.color, int64_t(x), y);
  }
  if (series.size() > 1) {  // legend, top right inside the frame
    size_t longest = 0;
    for (const Series& se : series) longest = std::max(longest, se.name.size());
    const double lw = 32 + 6.5 * double(longest);  // line sample, gap, ~6.5 px per character
    double lx = px1 - lw - 6, ly = py0 + 8;
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"legend\"/>\n",
                     lx - 6, ly - 4, lw, 16 * series.size() + 4);
    for (size_t i = 0; i < series.size(); ++i) {
      double y = ly + 16 * double(i) + 6;
      o += fmt::format(
          "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" "
          "stroke-width=\"2\"/>",
          lx, y, lx + 20, series[i].color);
      if (series[i].markers)
        o += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>", lx + 10, y,
                         series[i].color);
      o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 26, y + 4, esc(series[i].name));
    }
  }
  return o + "</svg>\n";
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  auto mid = v.begin() + std::ptrdiff_t(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

std::string fixed(double v, int decimals) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : "&mdash;";
}

constexpr const char* kStyle =
    R"(body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 12px; word-break: break-all; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table.summary td { padding: 2px 16px 2px 0; } table.summary td:first-child { color: #666; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; margin-top: 16px; }
svg { background: #fff; border: 1px solid #ddd; font: 11px system-ui, sans-serif; fill: #444; }
svg .title { font-size: 13px; font-weight: 600; fill: #222; }
svg .axis { font-size: 12px; fill: #222; }
svg .grid { stroke: #eee; } svg .frame { fill: none; stroke: #999; }
svg .legend { fill: #fff; fill-opacity: 0.85; stroke: #ccc; } svg .none { fill: #999; font-size: 13px; }
pre { background: #f6f6f6; border: 1px solid #ddd; padding: 12px; overflow-x: auto; }
)";

// One run's series against step, and its validation summary.
struct Curves {
  Points loss, val, lr, tps, gn, ce, load_max, load_mean, dropped;
  std::vector<double> tps_all;
  const Row* last_val = nullptr;
  const Row* best_val = nullptr;
};

Curves curves(const std::vector<Row>& rows) {
  Curves c;
  for (const Row& r : rows) {
    double x = double(r.step);
    if (std::isfinite(r.loss)) c.loss.push_back({x, r.loss});
    if (std::isfinite(r.lr)) c.lr.push_back({x, r.lr});
    if (std::isfinite(r.grad_norm)) c.gn.push_back({x, r.grad_norm});
    if (std::isfinite(r.ce_loss)) c.ce.push_back({x, r.ce_loss});
    if (std::isfinite(r.moe_tokens_max)) c.load_max.push_back({x, r.moe_tokens_max});
    if (std::isfinite(r.moe_tokens_mean)) c.load_mean.push_back({x, r.moe_tokens_mean});
    if (std::isfinite(r.moe_dropped)) c.dropped.push_back({x, r.moe_dropped});
    if (std::isfinite(r.tokens_per_s))
      c.tps.push_back({x, r.tokens_per_s}), c.tps_all.push_back(r.tokens_per_s);
    if (std::isfinite(r.val_loss)) {
      c.val.push_back({x, r.val_loss});
      c.last_val = &r;
      if (!c.best_val || r.val_loss < c.best_val->val_loss) c.best_val = &r;
    }
  }
  return c;
}

// The page up to its title heading, and the opening of the summary table.
std::string page_head(const std::string& title) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>loom report: {0}</title>\n<style>\n{1}</style>\n</head>\n<body>\n"
      "<h1>loom report: {0}</h1>\n<table class=\"summary\">\n",
      esc(title), kStyle);
}

}  // namespace

std::string render(const std::string& title, const std::vector<Row>& rows,
                   const std::string* config) {
  Curves c = curves(rows);
  const Row& fin = rows.back();
  std::string o = page_head(title);
  auto row = [&](const std::string& k, const std::string& v) {
    o += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", k, v);
  };
  row("steps", fmt::format("{} logged, steps {} to {}", rows.size(), rows.front().step, fin.step));
  row("final train loss", fixed(fin.loss, 4) + fmt::format(" (step {})", fin.step));
  row("final val loss",
      c.last_val ? fmt::format("{} (step {})", fixed(c.last_val->val_loss, 4), c.last_val->step)
                 : "&mdash;");
  if (c.best_val)
    row("best val loss",
        fmt::format("{} (step {})", fixed(c.best_val->val_loss, 4), c.best_val->step));
  row("median tokens/s", fixed(median(c.tps_all), 0));
  o += "</table>\n<div class=\"plots\">\n";
  std::vector<Series> losses{
      {.name = "train", .color = "#1f77b4", .pts = std::move(c.loss)},
      {.name = "val", .color = "#ff7f0e", .pts = std::move(c.val), .markers = true}};
  // an MoE model's loss includes its auxiliary losses; the cross-entropy is what val compares to
  if (!c.ce.empty())
    losses.insert(losses.begin() + 1,
                  {.name = "train cross-entropy", .color = "#17becf", .pts = std::move(c.ce)});
  o += svg_plot("loss", "loss", std::move(losses), false);
  o += svg_plot("learning rate", "lr", {{.name = "lr", .color = "#2ca02c", .pts = std::move(c.lr)}},
                true);
  o += svg_plot("throughput", "tokens/s",
                {{.name = "tokens/s", .color = "#9467bd", .pts = std::move(c.tps)}}, true);
  o += svg_plot("gradient norm", "grad norm (before clipping)",
                {{.name = "grad norm", .color = "#d62728", .pts = std::move(c.gn)}}, true);
  if (!c.load_max.empty())
    o +=
        svg_plot("router load (tokens per expert, all MoE layers)", "tokens",
                 {{.name = "busiest expert", .color = "#d62728", .pts = std::move(c.load_max)},
                  {.name = "mean expert", .color = "#1f77b4", .pts = std::move(c.load_mean)},
                  {.name = "dropped at capacity", .color = "#7f7f7f", .pts = std::move(c.dropped)}},
                 false);
  o += "</div>\n";
  if (config) o += "<h2>config.toml</h2>\n<pre>" + esc(*config) + "</pre>\n";
  return o + "</body>\n</html>\n";
}

std::string render_compare(const std::vector<std::string>& names,
                           const std::vector<std::vector<Row>>& runs) {
  static const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  std::string o = page_head(fmt::format("{} runs", runs.size()));
  o += "<tr><td>run</td><td>steps</td><td>final train loss</td><td>final val loss</td>"
       "<td>best val loss</td><td>median tokens/s</td></tr>\n";
  std::vector<Series> train, val;
  for (size_t i = 0; i < runs.size(); ++i) {
    Curves c = curves(runs[i]);
    o +=
        fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                    esc(names[i]), runs[i].back().step, fixed(runs[i].back().loss, 4),
                    fixed(c.last_val ? c.last_val->val_loss : NAN, 4),
                    fixed(c.best_val ? c.best_val->val_loss : NAN, 4), fixed(median(c.tps_all), 0));
    const char* color = palette[i % std::size(palette)];
    train.push_back({.name = names[i], .color = color, .pts = std::move(c.loss)});
    val.push_back({.name = names[i], .color = color, .pts = std::move(c.val), .markers = true});
  }
  o += "</table>\n<div class=\"plots\">\n";
  o += svg_plot("validation loss", "val loss", std::move(val), false);
  o += svg_plot("train loss", "loss", std::move(train), false);
  return o + "</div>\n</body>\n</html>\n";
}

}  // namespace loom::report
