/* Can processes a running ULFM job spawned leave it while the others go on?
 * (docs/investigations/grow-in-place.md, "Shrinking in place"). 2 ranks spawn 2 (given
 * "child"), merge, split; the children _exit(0), the parents do 10 allreduces on the
 * split communicator, then end with MPI_Finalize ("finalize") or _exit(0) ("exit");
 * an optional info key and value go to MPI_Comm_spawn.
 *   mpicc spawn_leave_probe.c -o spawn_leave_probe
 *   mpirun --with-ft ulfm --oversubscribe -np 2 ./spawn_leave_probe finalize [KEY VALUE]
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
  MPI_Comm parent, job;
  MPI_Comm_get_parent(&parent);
  int child = parent != MPI_COMM_NULL;
  if (child) {
    MPI_Intercomm_merge(parent, 1, &job);
  } else {
    MPI_Info info; MPI_Info_create(&info);
    if (argc > 3) MPI_Info_set(info, argv[2], argv[3]);
    char *args[] = {"child", NULL};
    MPI_Comm inter;
    MPI_Comm_spawn(argv[0], args, 2, info, 0, MPI_COMM_WORLD, &inter, MPI_ERRCODES_IGNORE);
    MPI_Intercomm_merge(inter, 0, &job);
  }
  MPI_Comm_set_errhandler(job, MPI_ERRORS_RETURN);
  int r, n; MPI_Comm_rank(job, &r); MPI_Comm_size(job, &n);
  MPI_Comm s; MPI_Comm_split(job, child ? MPI_UNDEFINED : 0, r, &s);
  if (child) { fprintf(stderr, "child %d leaves\n", r); _exit(0); }
  for (int i = 0; i < 10; i++) { int one = 1, sum; MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, s); usleep(100000); }
  fprintf(stderr, "parent %d done\n", r);
  if (!strcmp(argv[1], "exit")) _exit(0);
  MPI_Finalize();
  return 0;
}
