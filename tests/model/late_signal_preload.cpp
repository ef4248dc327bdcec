// Preloaded into `posembed train` under mpirun (mpi_test.sh, case late_signal):
// MPI_Finalize first raises the signal POSEMBED_TEST_LATE_SIGNAL names (INT,
// TERM or USR1) in the rank, as mpirun's forwarded copy lands when it comes after
// the rank's run returned. MPI's profiling interface makes PMPI_Finalize the
// library's own.
#include <mpi.h>

#include <csignal>
#include <cstdlib>
#include <string_view>

extern "C" int MPI_Finalize() {
  if (const char* name = std::getenv("POSEMBED_TEST_LATE_SIGNAL")) {
    const std::string_view signal = name;
    // (raise: delivered before it returns, so a default action ends the rank here)
    std::raise(signal == "INT" ? SIGINT : signal == "TERM" ? SIGTERM : SIGUSR1);
  }
  return PMPI_Finalize();
}
