#include "generate.hpp"

#include <algorithm>
#include <cmath>

#include "cp/layout.hpp"
#include "inputs.hpp"

namespace hcp::drivers {

void add_generate_keys(DeckSchema& s) {
  s.add_int("generate.new_tokens", 8, "tokens generated per sequence after the prompt", 1)
      .add_string("generate.sampling", "greedy",
                  "how the next token is chosen: greedy (the largest logit) or sample (from softmax(logits / "
                  "temperature), seeded by generate.seed)",
                  {"greedy", "sample"})
      .add_float("generate.temperature", 1.0, "sampling temperature (generate.sampling = sample)", 1e-6)
      .add_int("generate.seed", 1, "seed of the sampling draws", 0);
}

GenerateConfig generate_config(const Deck& d) {
  GenerateConfig g;
  g.new_tokens = d.get_int("generate.new_tokens");
  g.sampling = d.get_string("generate.sampling");
  g.temperature = d.get_float("generate.temperature");
  g.seed = static_cast<std::uint64_t>(d.get_int("generate.seed"));
  return g;
}

std::vector<std::int64_t> choose_tokens(const Tensor& logits, const GenerateConfig& g, std::int64_t step) {
  const std::int64_t B = logits.size(0), V = logits.size(1);
  std::vector<std::int64_t> out;
  const std::vector<double> x = logits.to_vector();
  for (std::int64_t b = 0; b < B; ++b) {
    const double* row = x.data() + b * V;
    std::int64_t best = 0;
    for (std::int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    if (g.sampling == "sample") {
      std::vector<double> w(static_cast<std::size_t>(V));
      double sum = 0;
      for (std::int64_t v = 0; v < V; ++v)
        sum += w[static_cast<std::size_t>(v)] = std::exp((row[v] - row[best]) / g.temperature);
      const std::uint64_t h = mix64(mix64(g.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(b)) +
                                    static_cast<std::uint64_t>(step));
      double u = static_cast<double>(h >> 11) * 0x1.0p-53 * sum, acc = 0;
      best = V - 1;
      for (std::int64_t v = 0; v < V; ++v) {
        acc += w[static_cast<std::size_t>(v)];
        if (u < acc) {
          best = v;
          break;
        }
      }
    }
    out.push_back(best);
  }
  return out;
}

std::vector<std::int64_t> Generated::flat_ids() const {
  std::vector<std::int64_t> out;
  for (const auto& s : ids) out.insert(out.end(), s.begin(), s.end());
  return out;
}

namespace {
const std::vector<std::string> kDecodeOps = {"all_reduce", "all_gather"};
}  // namespace

Generated generate(Communicator& comm, model::HybridModel& m, const model::ParamMap& p,
                   const std::vector<std::int64_t>& tokens, const GenerateConfig& g, PhaseTimes* laps,
                   const std::vector<std::int64_t>& labels) {
  Generated out;
  const std::int64_t B = m.placement().global.nseq(), N = g.new_tokens;
  const std::vector<std::int64_t> lab = labels.empty() ? std::vector<std::int64_t>(tokens.size(), -100) : labels;
  const std::int64_t b0 = comm.bytes_sent();
  m.keep_handoff(true);
  m.forward(p, tokens, lab);
  Tensor logits = host(m.last_logits());
  out.prefill_bytes = comm.bytes_sent() - b0;
  out.prefill_kind_bytes = m.forward_bytes();
  if (laps) laps->lap("prefill");
  model::HybridDecoder dec(m, N - 1);
  out.mamba_bytes = dec.mamba_bytes();
  out.kv_bytes = dec.kv_bytes();
  if (laps) laps->lap("handoff");
  const std::int64_t b1 = comm.bytes_sent(), c1 = comm.bytes_sent(kDecodeOps);
  out.ids.assign(static_cast<std::size_t>(B), {});
  std::vector<std::int64_t> next;
  for (std::int64_t t = 0; t < N; ++t) {
    if (t > 0) logits = host(dec.step(p, next));
    out.logits.push_back(logits);
    next = choose_tokens(logits, g, t);
    for (std::int64_t b = 0; b < B; ++b)
      out.ids[static_cast<std::size_t>(b)].push_back(next[static_cast<std::size_t>(b)]);
  }
  out.decode_bytes = comm.bytes_sent() - b1;
  out.decode_collective_bytes = comm.bytes_sent(kDecodeOps) - c1;
  out.kv_rows = dec.kv_rows_per_rank()[static_cast<std::size_t>(comm.rank())];
  if (laps) laps->lap("decode");
  return out;
}

std::vector<std::vector<std::int64_t>> prompts_of(const TokenBatch& b) {
  std::vector<std::vector<std::int64_t>> out;
  for (std::int64_t s = 0; s < b.layout.nseq(); ++s) {
    const auto first = b.tokens.begin() + b.layout.cu_seqlens[static_cast<std::size_t>(s)];
    out.emplace_back(first, first + b.layout.real(s));
  }
  return out;
}

std::vector<std::int64_t> concat(const std::vector<std::vector<std::int64_t>>& seqs) {
  std::vector<std::int64_t> out;
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return out;
}

SeqLayout unpadded_thd(const std::vector<std::vector<std::int64_t>>& seqs) {
  std::vector<std::int64_t> cu{0};
  for (const auto& s : seqs) cu.push_back(cu.back() + static_cast<std::int64_t>(s.size()));
  return SeqLayout::thd(cu);
}

Tensor teacher_forced_logits(Communicator& self, const model::HybridConfig& c1, const model::ParamMap& p1,
                             const std::vector<std::vector<std::int64_t>>& prompts, const Generated& got) {
  const auto B = static_cast<std::int64_t>(prompts.size());
  const auto N = static_cast<std::int64_t>(got.logits.size());
  std::vector<std::vector<std::int64_t>> seqs = prompts;
  for (std::int64_t s = 0; s < B; ++s)
    seqs[static_cast<std::size_t>(s)].insert(seqs[static_cast<std::size_t>(s)].end(),
                                             got.ids[static_cast<std::size_t>(s)].begin(),
                                             got.ids[static_cast<std::size_t>(s)].end() - 1);
  const SeqLayout lay = unpadded_thd(seqs);
  model::HybridModel m(self, c1, lay);
  const std::vector<std::int64_t> tokens = concat(seqs);
  m.forward(p1, tokens, std::vector<std::int64_t>(tokens.size(), -100));
  const Tensor all = host(m.logits());
  const std::int64_t V = c1.vocab;
  Tensor out = Tensor::zeros({N, B, V}, all.dtype());
  std::vector<std::int64_t> src, dst;
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t s = 0; s < B; ++s) {
      dst.push_back(t * B + s);
      src.push_back(lay.cu_seqlens[static_cast<std::size_t>(s)] +
                    static_cast<std::int64_t>(prompts[static_cast<std::size_t>(s)].size()) - 1 + t);
    }
  Tensor flat = out.view({N * B, V});
  cp::copy_rows(flat, all, dst, src);
  return out;
}

bool ranks_agree(Communicator& comm, const std::vector<std::int64_t>& ids) {
  std::vector<double> hi(ids.begin(), ids.end()), lo;
  for (double v : hi) lo.push_back(-v);
  const auto n = static_cast<std::int64_t>(ids.size());
  comm.all_reduce(hi.data(), n, DType::F64, ReduceOp::Max);
  comm.all_reduce(lo.data(), n, DType::F64, ReduceOp::Max);
  for (std::int64_t i = 0; i < n; ++i)
    if (hi[static_cast<std::size_t>(i)] != -lo[static_cast<std::size_t>(i)]) return false;
  return true;
}

void write_generation(ResultsWriter& w, const std::string& name, const Generated& got, const GenerateBytes& b,
                      bool check, const std::vector<double>& errs, const std::map<char, std::int64_t>& model) {
  const std::string g = "/generate/" + name + "/";
  w.counts(g + "ids", got.flat_ids(), "[sequences * new_tokens] sequence-major", "id");
  if (check)
    w.tensor(g + "logits_err",
             errs.empty() ? Tensor() : Tensor::from(errs, {static_cast<std::int64_t>(errs.size())}, DType::F64),
             "[new_tokens] error of each generated token's logits against teacher forcing", "1");
  w.per_rank(g + "prefill_bytes", static_cast<double>(got.prefill_bytes), "bytes");
  const auto of = [](const std::map<char, std::int64_t>& by, char k) {
    const auto it = by.find(k);
    return static_cast<double>(it == by.end() ? 0 : it->second);
  };
  w.per_rank(g + "prefill_bytes_attention", of(got.prefill_kind_bytes, '*'), "bytes");
  w.per_rank(g + "prefill_bytes_attention_model", of(model, '*'), "bytes");
  w.per_rank(g + "prefill_bytes_mamba", of(got.prefill_kind_bytes, 'M'), "bytes");
  w.per_rank(g + "prefill_bytes_mamba_model", of(model, 'M'), "bytes");
  w.per_rank(g + "prefill_bytes_moe", of(got.prefill_kind_bytes, 'E'), "bytes");
  w.per_rank(g + "decode_bytes_per_token", b.decode_per_token, "bytes");
  w.per_rank(g + "handoff_mamba_bytes", static_cast<double>(got.mamba_bytes), "bytes");
  w.per_rank(g + "handoff_kv_bytes", static_cast<double>(got.kv_bytes), "bytes");
  w.per_rank(g + "kv_tokens", static_cast<double>(got.kv_rows), "tokens");
}

GenerateBytes generate_bytes_sent(Communicator& comm, const Generated& got) {
  GenerateBytes b;
  const auto steps = static_cast<double>(std::max<std::int64_t>(got.decode_steps(), 1));
  b.decode_per_token = static_cast<double>(got.decode_bytes) / steps;
  b.prefill_max = comm.all_reduce_scalar(static_cast<double>(got.prefill_bytes), ReduceOp::Max);
  b.decode_max = comm.all_reduce_scalar(b.decode_per_token, ReduceOp::Max);
  b.handoff_max = comm.all_reduce_scalar(static_cast<double>(got.mamba_bytes + got.kv_bytes), ReduceOp::Max);
  return b;
}

}  // namespace hcp::drivers
