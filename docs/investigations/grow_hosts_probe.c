/* Probe (docs/investigations/grow-in-place.md, "Across hosts"): grow a running ULFM job of
 * Open MPI 5 onto a host that is not in its allocation: MPI_Comm_spawn_multiple, one app
 * a host (PMIX_HOST), the first also carrying PMIX_ADD_HOST, then MPI_Intercomm_merge.
 *   mpicc -O1 -o grow_hosts grow_hosts_probe.c
 *   mpirun --with-ft ulfm -np 2 --host hostA:2 --oversubscribe --bind-to none \
 *       ./grow_hosts hostB:2 hostA:1 hostB:2      (ADD_HOST_VALUE HOST:N [HOST:N ...])
 * ADD_ON_ALL=1 in the environment puts PMIX_ADD_HOST on every app. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm parent, merged;
  char host[256]; gethostname(host, sizeof host);
  MPI_Comm_get_parent(&parent);
  if (parent != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
    int rc = MPI_Intercomm_merge(parent, 1, &merged);
    int r, n; MPI_Comm_rank(merged, &r); MPI_Comm_size(merged, &n);
    int one = r + 1, sum = 0;
    rc |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
    printf("child env PROBE_X=%s PROBE_Y=%s\n", getenv("PROBE_X"), getenv("PROBE_Y"));
    printf("child pid %d on %s merged rank %d/%d sum %d rc %d\n", getpid(), host, r, n, sum, rc);
    fflush(stdout);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
  }
  /* argv: ADD_HOST_VALUE HOST:N [HOST:N ...] ; one app per host, info host=HOST (and add-host on each app) */
  const char *add = argv[1];
  int napps = argc - 2;
  char *cmds[16]; int counts[16]; MPI_Info infos[16];
  for (int i = 0; i < napps; i++) {
    char h[256]; strncpy(h, argv[2 + i], 255); h[255] = 0;
    char *c = strrchr(h, ':'); counts[i] = atoi(c + 1); *c = 0;
    cmds[i] = argv[0];
    MPI_Info_create(&infos[i]);
    MPI_Info_set(infos[i], "PMIX_HOST", h);
    if (*add && (getenv("ADD_ON_ALL") || i == 0)) MPI_Info_set(infos[i], "PMIX_ADD_HOST", (char *)add);
    MPI_Info_set(infos[i], "bind_to", "none");
  }
  int wr; MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm inter; int errs[64];
  double t0 = MPI_Wtime();
  int rc = MPI_Comm_spawn_multiple(napps, cmds, MPI_ARGVS_NULL, counts, infos, 0, MPI_COMM_WORLD, &inter, errs);
  double t1 = MPI_Wtime();
  MPI_Info info = MPI_INFO_NULL;
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING]; int len; MPI_Error_string(rc, msg, &len);
    printf("parent %d on %s: spawn failed after %.3f s: %s\n", wr, host, t1 - t0, msg); fflush(stdout);
    MPI_Finalize();
    return 3;
  }
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  rc = MPI_Intercomm_merge(inter, 0, &merged);
  int r, n; MPI_Comm_rank(merged, &r); MPI_Comm_size(merged, &n);
  int one = r + 1, sum = 0;
  rc |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
  printf("parent pid %d on %s old rank %d merged rank %d/%d sum %d (expect %d) rc %d spawn %.3f s\n",
         getpid(), host, wr, r, n, sum, n * (n + 1) / 2, rc, t1 - t0);
  fflush(stdout);
  MPI_Comm_free(&merged);
  MPI_Comm_disconnect(&inter);
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  MPI_Finalize();
  return 0;
}
