// atoll-bench-ucx: bus bandwidth of atoll's UCX all-gather and reduce-scatter between processes
// (issue 11), one rank per process, for 1..64 MiB per collective. bench/ucx_bandwidth.sh starts
// the processes and compares with ucx_perftest's tag bandwidth over the same transport.
//   atoll-bench-ucx --node-rank R --nnodes N --master-port P [--max-mib 64]
// Bus bandwidth as NCCL's tests define it: bytes of the whole gathered (or reduced) buffer over
// the time, times (N-1)/N. Node 0 prints one line per size and collective. Also one way, the load
// ucx_perftest's tag_bw puts on the machine: node 0 sends each rank's message (the buffer / N) to
// node 1 one after another (the collectives' way: one at a time); timed at node 0 up to node 1's
// acknowledgement of the last.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "comm/rendezvous/tcp_rendezvous.hpp"
#include "comm/ucx/ucx_world.hpp"

namespace {
constexpr double kMiB = 1024.0 * 1024.0;  // ucx_perftest reports bandwidth in MiB/s: compared like for like
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll-bench-ucx: UCX all-gather and reduce-scatter bus bandwidth between processes"};
  int node = 0, nnodes = 2, port = 29512, max_mib = 64;
  bool peer_errors = true;
  app.add_option("--node-rank", node)->required();
  app.add_option("--nnodes", nnodes);
  app.add_option("--master-port", port);
  app.add_option("--max-mib", max_mib);
  app.add_option("--peer-errors", peer_errors, "UCX peer error handling (tcp on one machine; shared memory without)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a bad command line exits 2, as the apps' do
  }
  try {
    atl::UcxWorld world(nnodes, {node}, nullptr, peer_errors);
    atl::RendezvousSettings settings;
    settings.master_port = port;
    settings.node_rank = node;
    settings.nnodes = nnodes;
    const char* token = std::getenv("ATOLL_JOB_TOKEN");
    settings.token = token ? token : "bench";
    settings.job = R"({"bench":"ucx"})";
    world.connect(atl::rendezvous(settings, world.local_addresses()));
    atl::Group group{"world", {}};
    for (int r = 0; r < nnodes; ++r) group.ranks.push_back(r);
    auto comm = world.communicator(group, node);
    for (int mib = 1; mib <= max_mib; mib *= 2) {
      const std::int64_t total = static_cast<std::int64_t>(mib) << 20;  // bytes of the whole buffer
      const std::int64_t per_rank = total / 4 / nnodes;                 // f32 elements per rank
      const atl::Tensor part = atl::Tensor::full({per_rank}, 1.0f);
      const atl::Tensor whole = atl::Tensor::full({per_rank * nnodes}, 1.0f);
      const int iterations = std::max(5, 256 / mib);
      for (const char* name : {"all_gather", "reduce_scatter"}) {
        const bool gather = name[0] == 'a';
        auto once = [&] {
          atl::run_and_wait([&](atl::Completion done) {
            if (gather) {
              comm->all_gather(part, whole, "bench", std::move(done));
            } else {
              comm->reduce_scatter(whole, part, "bench", std::move(done));
            }
          });
        };
        for (int w = 0; w < 2; ++w) once();  // warm-up: endpoints, registrations
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) once();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
        const double bus = static_cast<double>(total) / seconds * (nnodes - 1) / nnodes;
        if (node == 0) {
          std::printf("ucx %s %d MiB: bus bandwidth %.1f MiB/s (peer errors %s)\n", name, mib, bus / kMiB,
                      peer_errors ? "on" : "off");
        }
      }
      if (nnodes < 2 || node > 1) continue;  // one way: node 0 to node 1
      const atl::Tensor ack = atl::Tensor::zeros({1});
      auto one_way = [&](int messages) {
        for (int i = 0; i < messages; ++i) {
          atl::run_and_wait([&](atl::Completion done) {
            if (node == 0) comm->send(part, 1, "bench", std::move(done)); else comm->recv(part, 0, "bench", std::move(done));
          });
        }
        atl::run_and_wait([&](atl::Completion done) {
          if (node == 0) comm->recv(ack, 1, "bench", std::move(done)); else comm->send(ack, 0, "bench", std::move(done));
        });
      };
      one_way(2);  // warm-up
      const auto start = std::chrono::steady_clock::now();
      one_way(iterations);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (node == 0) {
        std::printf("ucx one_way %d MiB: send-recv bandwidth %.1f MiB/s (peer errors %s)\n", mib,
                    static_cast<double>(part.bytes()) * iterations / seconds / kMiB, peer_errors ? "on" : "off");
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atoll-bench-ucx: %s\n", e.what());
    return 1;
  }
}
