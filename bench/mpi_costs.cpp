// The point-to-point and allreduce costs the cost model is calibrated from
// (scripts/calibrate-cost-model): under mpirun, ranks 0 and 1 ping-pong messages of each size,
// and all ranks allreduce float buffers of each size (MPI_Allreduce, MPI_SUM, in place), each
// repeated; prints one JSON line per measurement on rank 0:
//   {"op": "pingpong", "ranks": 2, "bytes": N, "seconds": one-way time, median of repeats}
//   {"op": "allreduce", "ranks": P, "bytes": N, "seconds": median over repeats of the slowest rank}
// usage: mpirun -np P mpi_costs [--repeats R] [--max-bytes B]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int usage(int rank, const std::string& why) {
  if (rank == 0)
    std::fprintf(stderr,
                 "mpi_costs: %s\nusage: mpirun -np P mpi_costs [--repeats R] [--max-bytes B]\n",
                 why.c_str());
  MPI_Finalize();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long repeats = 20, max_bytes = 64L << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--repeats" || a == "--max-bytes") && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > (1L << 31))
        return usage(rank, a + " must be a positive integer up to 2^31, got '" + argv[i] + "'");
      (a == "--repeats" ? repeats : max_bytes) = v;
    } else {
      return usage(rank, "unknown argument '" + a + "'");
    }
  }
  if (size < 2) return usage(rank, "needs at least 2 ranks (mpirun -np 2 or more)");
  std::vector<char> buffer(static_cast<std::size_t>(max_bytes), 1);
  for (long bytes = 4; bytes <= max_bytes; bytes *= 4) {
    std::vector<double> times;
    for (long r = 0; r < repeats + 2; ++r) {  // two warm-up rounds
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buffer.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buffer.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(buffer.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        MPI_Send(buffer.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
      if (r >= 2) times.push_back((MPI_Wtime() - t0) / 2.0);
    }
    if (rank == 0)
      std::printf("{\"op\": \"pingpong\", \"ranks\": 2, \"bytes\": %ld, \"seconds\": %.9g}\n",
                  bytes, median(times));
  }
  auto* floats = reinterpret_cast<float*>(buffer.data());
  std::memset(buffer.data(), 0, buffer.size());
  for (long bytes = 4; bytes <= max_bytes; bytes *= 4) {
    std::vector<double> times;
    for (long r = 0; r < repeats + 2; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, floats, static_cast<int>(bytes / 4), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      double took = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &took, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 2) times.push_back(took);
    }
    if (rank == 0)
      std::printf("{\"op\": \"allreduce\", \"ranks\": %d, \"bytes\": %ld, \"seconds\": %.9g}\n",
                  size, bytes, median(times));
  }
  std::fflush(stdout);
  MPI_Finalize();
  return 0;
}
