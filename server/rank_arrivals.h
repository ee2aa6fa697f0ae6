// Which rank has sent which column for which step of its open round, in
// memory that does not multiply ranks by columns: per rank and step of its
// open round, the set of columns received as runs of the daemon's columns.
//
//   RankArrivals arr({5, 7}, /*world=*/4096);  // columns per tensor
//   arr.SetImportant(0, important);           // whenever the selection changes
//   if (!arr.Received(t, rank, step, c)) arr.MarkReceived(t, rank, step, c);
//   ...  // at the rank's close
//   if (arr.FirstIncomplete(rank, steps, &miss)) ...  // reject the close
//   arr.ResetRank(rank);
//
// Columns are numbered by their place among the daemon's (unimportant)
// columns of all tensors, tensor after tensor (an important column has no
// number: it is never received). A rank's shards of one step carry its
// columns in ascending runs, so each step's set is a handful of runs
// [first, end) of those numbers, merged as they meet: whatever the
// selection's gaps, a rank that sent every column of a step holds one run.
// The footprint charges kChargedRunsPerStep runs per rank and step; a rank
// whose shards of a step arrive scattered holds more (16 B per run).
//
// Not thread-safe: its owner (Job) serializes access under its mutex.
#ifndef ZENFLOW_SERVER_RANK_ARRIVALS_H_
#define ZENFLOW_SERVER_RANK_ARRIVALS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace zenflow {

class RankArrivals {
 public:
  // Runs per rank and step the footprint charges (ComputeJobFootprint).
  static constexpr int64_t kChargedRunsPerStep = 8;
  // Bytes the footprint charges per rank and step of the open round, and
  // per rank.
  static constexpr int64_t kBytesPerStep = 32 + 16 * kChargedRunsPerStep;
  static constexpr int64_t kBytesPerRank = 24;
  // Per column (its number: 4 B).
  static constexpr int64_t kBytesPerColumn = 4;

  // Every column of every tensor unimportant; nothing received.
  RankArrivals(const std::vector<int64_t>& cols, int world);

  // Tensor t's selection (important[c] != 0: column c is updated on the
  // ranks). The columns' numbers change: what ranks have received so far
  // is kept, for the columns that stay unimportant.
  void SetImportant(int t, const std::vector<uint8_t>& important);

  // Whether `rank` sent column c of tensor t for `step` (an important
  // column: never).
  bool Received(int t, int rank, int64_t step, int32_t c) const;
  // Records it. Column c must be unimportant and not yet received.
  void MarkReceived(int t, int rank, int64_t step, int32_t c);
  // Steps of the rank's open round that have column c of tensor t: a walk
  // over all of them.
  int32_t hits(int t, int rank, int32_t c) const;
  // Whether any step of the rank's open round has column c of tensor t
  // (hits() > 0), from its oldest step on: a column the rank sends every
  // step answers at the first, however long the round (the shard path asks
  // for every column of every shard).
  bool Seen(int t, int rank, int32_t c) const;
  // The first unimportant column (tensor order, then column order) that
  // does not have exactly `steps` steps from `rank`: false if there is none.
  struct Miss {
    int tensor = 0;
    int32_t column = 0;
    int32_t hits = 0;
  };
  bool FirstIncomplete(int rank, int64_t steps, Miss* miss) const;
  // The rank closed its round: nothing received.
  void ResetRank(int rank);

  // Bytes held now (the runs, the steps, the columns' numbers).
  int64_t bytes() const;

  // For checkpoints: every rank's steps and runs, in the columns' numbers
  // of the selection at the time (restore the selection first).
  std::string Save() const;
  absl::Status Load(const std::string& bytes);
  // From a checkpoint written before this class (per rank and column the
  // last step received and the open round's count of steps): column c is
  // taken to have steps last - hits + 1 .. last.
  void LoadPerColumn(int t, int rank, const int64_t* last, const int32_t* hits);

 private:
  using Run = std::pair<int64_t, int64_t>;  // [first, end) of the numbers
  struct Step {
    int64_t step;
    std::vector<Run> runs;  // ascending, disjoint, never adjacent
  };
  // The first of steps (ascending) whose step is not below `step`.
  static std::vector<Step>::const_iterator StepAt(const std::vector<Step>& steps, int64_t step);
  static std::vector<Step>::iterator StepAt(std::vector<Step>& steps, int64_t step);
  // Column c's number, or -1 when it is important.
  int64_t Number(int t, int32_t c) const;
  // The (tensor, column) of number k.
  std::pair<int, int32_t> Column(int64_t k) const;
  void Renumber();  // offset_ from before_
  static bool Contains(const std::vector<Run>& runs, int64_t k);
  static void Insert(std::vector<Run>* runs, int64_t k);

  // Per tensor: per column the count of unimportant columns before it
  // (cols + 1 entries: column c is important when entries c and c + 1 are
  // equal), and the number of its first column (tensors + 1 entries).
  std::vector<std::vector<int32_t>> before_;
  std::vector<int64_t> offset_;
  std::vector<std::vector<Step>> ranks_;  // [rank]: the open round's steps, ascending
  // Emptied run lists of closed rounds' steps, reused by the next steps, so
  // that a warm job allocates nothing per round (server:shard_alloc_test).
  std::vector<std::vector<Run>> spare_;
  void Release(std::vector<Step>* steps);  // their runs into spare_, then clear
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_RANK_ARRIVALS_H_
