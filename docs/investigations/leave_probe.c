/* Can ranks leave a running Open MPI 5 job (ULFM) while the others go on?
 * (docs/investigations/grow-in-place.md, "Shrinking in place").
 * Ranks in the upper half leave after MPI_Comm_split (MPI_UNDEFINED): with MPI_Finalize
 * ("finalize", the default) or with _exit(0) at once ("exit"); the others do 30
 * allreduces 0.1 s apart on the split communicator and finalize.
 *   mpicc leave_probe.c -o leave_probe
 *   mpirun --with-ft ulfm --oversubscribe -np 4 ./leave_probe exit; echo $?
 */
#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm w; MPI_Comm_dup(MPI_COMM_WORLD, &w);
  MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN);
  int r, n; MPI_Comm_rank(w, &r); MPI_Comm_size(w, &n);
  double t0 = MPI_Wtime();
  const char *how = argc > 1 ? argv[1] : "finalize";
  int stay = r < n / 2;
  MPI_Comm s; int rc = MPI_Comm_split(w, stay ? 0 : MPI_UNDEFINED, r, &s);
  fprintf(stderr, "rank %d split rc %d stay %d\n", r, rc, stay);
  if (!stay) {
    MPI_Comm_free(&w);
    if (!strcmp(how, "exit")) { fprintf(stderr, "rank %d _exit at %.2f\n", r, MPI_Wtime() - t0); _exit(0); }
    MPI_Finalize();
    fprintf(stderr, "rank %d finalized at %.2f\n", r, MPI_Wtime() - t0);
    return 0;
  }
  MPI_Comm_set_errhandler(s, MPI_ERRORS_RETURN);
  for (int i = 0; i < 30; i++) {
    int one = 1, sum = 0; rc = MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, s);
    if (rc || sum != n / 2) fprintf(stderr, "rank %d step %d rc %d sum %d\n", r, i, rc, sum);
    usleep(100000);
  }
  fprintf(stderr, "rank %d stayers done at %.2f\n", r, MPI_Wtime() - t0);
  MPI_Comm_free(&s); MPI_Comm_free(&w);
  MPI_Finalize();
  fprintf(stderr, "rank %d finalized at %.2f\n", r, MPI_Wtime() - t0);
  return 0;
}
