// A driver that fails on purpose (tests of the harness's error paths).
#include <mpi.h>

#include <thread>

#include "harness.hpp"

int main(int argc, char** argv) {
  hcp::DriverSpec spec;
  spec.name = "hcp_fail_probe";
  spec.description = "fails on one rank (tests only)";
  spec.schema.add_int("probe.fail_rank", -1, "rank that throws in the run phase (-1: none)", -1)
      .add_int("probe.validate_fail_rank", -1, "rank that throws in the validate phase (-1: none)", -1);
  spec.builtin_deck = "[probe]\nfail_rank = -1\n";
  spec.validate = [](hcp::DriverContext& ctx) {
    if (ctx.deck.get_int("probe.validate_fail_rank") == ctx.world->rank())
      throw hcp::Error("validate failure on rank " + std::to_string(ctx.world->rank()));
  };
  spec.run = [](hcp::DriverContext& ctx) {
    if (ctx.deck.get_int("probe.fail_rank") == ctx.world->rank()) throw hcp::Error("deliberate failure");
    // The other ranks wait in a collective that the failing rank never joins: MPI_Abort must end them.
    ctx.world->barrier();
  };
  return hcp::run_driver(argc, argv, spec);
}
