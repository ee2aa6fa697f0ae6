// The factored second moment of a round's columns; see factored_moment.h.
#include "server/factored_moment.h"

#include <cmath>

namespace zenflow {
namespace {

constexpr int kLanes = 8;
static_assert(kFactoredRowBlock % kLanes == 0, "a block starts a new set of lanes");

}  // namespace

std::vector<FactoredMoment> ComputeFactoredMoments(const std::vector<FactoredMomentTensor>& tensors,
                                                   float beta2, const ParallelRange& parallel) {
  // A task is one block of rows of one tensor, over all its columns: it
  // owns its rows' sums outright and writes its own partial column sums, so
  // no two tasks touch the same double and the order of every sum is fixed.
  struct Task {
    size_t tensor;
    int64_t first_row, rows;
  };
  std::vector<Task> tasks;
  std::vector<std::vector<double>> row_sum(tensors.size()), col_part(tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FactoredMomentTensor& t = tensors[ti];
    const size_t ncols = t.columns->size();
    if (ncols == 0 || t.rows <= 0) continue;
    const int64_t blocks = (t.rows + kFactoredRowBlock - 1) / kFactoredRowBlock;
    row_sum[ti].assign(static_cast<size_t>(t.rows), 0.0);
    col_part[ti].assign(static_cast<size_t>(blocks) * ncols, 0.0);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * kFactoredRowBlock;
      tasks.push_back({ti, first, std::min(kFactoredRowBlock, t.rows - first)});
    }
  }
  parallel(tasks.size(), [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const Task& task = tasks[k];
      const FactoredMomentTensor& t = tensors[task.tensor];
      const std::vector<int32_t>& cols = *t.columns;
      double* rows = row_sum[task.tensor].data() + task.first_row;
      double* part = col_part[task.tensor].data() +
                     static_cast<size_t>(task.first_row / kFactoredRowBlock) * cols.size();
      int64_t last_count = -1;
      double inv_bc2 = 1.0;
      for (size_t j = 0; j < cols.size(); ++j) {
        const int64_t count = t.count(cols[j]);
        if (count != last_count) {
          // Adjacent columns mostly share a count: one pow per run of them.
          last_count = count;
          const double bc2 =
              1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(count));
          inv_bc2 = count > 0 && bc2 > 0 ? 1.0 / bc2 : 1.0;
        }
        const float* v = t.v(cols[j]) + task.first_row;
        // kLanes partial sums (row r into lane r % kLanes; blocks start at
        // a multiple of kLanes) instead of one: no chain of dependent adds,
        // so the pass runs at the speed of reading v.
        double lane[kLanes] = {};
        int64_t r = 0;
        for (; r + kLanes <= task.rows; r += kLanes) {
          for (int l = 0; l < kLanes; ++l) {
            const double vh = static_cast<double>(v[r + l]) * inv_bc2;
            rows[r + l] += vh;
            lane[l] += vh;
          }
        }
        for (int l = 0; r < task.rows; ++r, ++l) {
          const double vh = static_cast<double>(v[r]) * inv_bc2;
          rows[r] += vh;
          lane[l] += vh;
        }
        part[j] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                  ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      }
    }
  });
  std::vector<FactoredMoment> out(tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FactoredMomentTensor& t = tensors[ti];
    const size_t ncols = t.columns->size();
    if (ncols == 0 || t.rows <= 0) continue;
    const size_t blocks = col_part[ti].size() / ncols;
    FactoredMoment& f = out[ti];
    f.row_v.resize(static_cast<size_t>(t.rows));
    f.col_v.resize(ncols);
    for (int64_t r = 0; r < t.rows; ++r) {
      f.row_v[r] = static_cast<float>(row_sum[ti][r] / static_cast<double>(ncols));
    }
    double total = 0;
    for (size_t j = 0; j < ncols; ++j) {
      double s = 0;
      for (size_t b = 0; b < blocks; ++b) s += col_part[ti][b * ncols + j];
      f.col_v[j] = static_cast<float>(s / static_cast<double>(t.rows));
      total += s;
    }
    f.v_mean = static_cast<float>(total / (static_cast<double>(t.rows) * static_cast<double>(ncols)));
  }
  return out;
}

}  // namespace zenflow
