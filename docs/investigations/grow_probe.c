/* Probe (docs/investigations/grow-in-place.md): grow a running ULFM job of Open MPI 5 with
 * MPI_Comm_spawn + MPI_Intercomm_merge, optionally after a SIGKILL and MPIX_Comm_shrink.
 *   mpicc -o grow_probe grow_probe.c
 *   mpirun --with-ft ulfm -np 2 --oversubscribe ./grow_probe grow 2 [INFO_KEY VALUE]
 *   mpirun --with-ft ulfm -np 3 --oversubscribe ./grow_probe shrinkgrow 2 */
#include <mpi.h>
#include <mpi-ext.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double now(void) { return MPI_Wtime(); }

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm parent, merged;
  MPI_Comm_get_parent(&parent);
  const char *mode = argc > 1 ? argv[1] : "grow";
  int nspawn = argc > 2 ? atoi(argv[2]) : 2;
  const char *key = argc > 3 ? argv[3] : "";
  const char *val = argc > 4 ? argv[4] : "";
  if (parent != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
    int rc = MPI_Intercomm_merge(parent, 1, &merged);
    int r, n; MPI_Comm_rank(merged, &r); MPI_Comm_size(merged, &n);
    int one = r + 1, sum = 0;
    rc |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
    printf("child env PROBE_X=%s PROBE_Y=%s cwd-ok\n", getenv("PROBE_X"), getenv("PROBE_Y"));
    printf("child pid %d merged rank %d/%d sum %d rc %d\n", getpid(), r, n, sum, rc);
    fflush(stdout);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
  }
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  int wr, wn; MPI_Comm_rank(world, &wr); MPI_Comm_size(world, &wn);
  if (!strcmp(mode, "shrinkgrow")) {
    MPI_Barrier(world);
    if (wr == wn - 1) { printf("rank %d pid %d: SIGKILL myself\n", wr, getpid()); fflush(stdout); raise(SIGKILL); }
    int x = 1, y = 0;
    int rc = MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, world);
    int cls = 0; MPI_Error_class(rc, &cls);
    printf("rank %d: allreduce with the dead rank: rc class %d (PROC_FAILED=%d REVOKED=%d)\n", wr, cls, MPIX_ERR_PROC_FAILED, MPIX_ERR_REVOKED); fflush(stdout);
    MPIX_Comm_revoke(world);
    MPI_Comm shrunk;
    double t0 = now();
    MPIX_Comm_shrink(world, &shrunk);
    MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
    MPI_Comm_free(&world);
    world = shrunk;
    MPI_Comm_rank(world, &wr); MPI_Comm_size(world, &wn);
    printf("rank %d: shrunk to %d ranks in %.3f s\n", wr, wn, now() - t0); fflush(stdout);
  }
  setenv("PROBE_Y", "set-in-parent", 1);
  MPI_Info info = MPI_INFO_NULL;
  if (*key) { MPI_Info_create(&info); MPI_Info_set(info, key, val); }
  MPI_Comm inter;
  int errs[64];
  double t0 = now();
  int rc = MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, nspawn, info, 0, world, &inter, errs);
  double t1 = now();
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING]; int len; MPI_Error_string(rc, msg, &len);
    printf("rank %d: spawn failed: %s\n", wr, msg); fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  rc = MPI_Intercomm_merge(inter, 0, &merged);
  double t2 = now();
  int r, n; MPI_Comm_rank(merged, &r); MPI_Comm_size(merged, &n);
  int one = r + 1, sum = 0;
  rc |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
  double t3 = now();
  printf("parent pid %d old rank %d merged rank %d/%d sum %d (expect %d) rc %d spawn %.3f s merge %.3f s allreduce %.3f s\n",
         getpid(), wr, r, n, sum, n * (n + 1) / 2, rc, t1 - t0, t2 - t1, t3 - t2);
  fflush(stdout);
  MPI_Comm_free(&merged);
  MPI_Comm_disconnect(&inter);
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  MPI_Finalize();
  return 0;
}
