/* A second NCCL in the process, as torch's own NCCL 2.28.9 is beside the one Perseus
 * loads by path (PERSEUS_NCCL_LIB): tests/rank_scripts/gpu_nccl_copy.py loads it global before
 * Perseus starts, as torch does its NCCL. It reports version 2.28.9, and every NCCL
 * function Perseus calls counts a call here and fails, so that a call that reaches this
 * copy instead of the one Perseus loaded shows: Perseus's own (through its dlopen
 * handle), and the loaded library's calls to its own exported functions (which
 * RTLD_DEEPBIND keeps inside it). */
static long g_calls;
long other_nccl_calls(void) { return g_calls; }

int ncclGetVersion(int* v) {
  g_calls++;
  *v = 22809;
  return 0;
}

#define REFUSED(name) \
  int name(void) {    \
    g_calls++;        \
    return 5;         \
  }
REFUSED(ncclGetUniqueId)
REFUSED(ncclCommInitRank)
REFUSED(ncclCommInitRankConfig)
REFUSED(ncclCommDestroy)
REFUSED(ncclCommAbort)
REFUSED(ncclCommGetAsyncError)
REFUSED(ncclRedOpCreatePreMulSum)
REFUSED(ncclRedOpDestroy)
REFUSED(ncclAllReduce)
REFUSED(ncclBroadcast)
REFUSED(ncclReduce)
REFUSED(ncclAllGather)
REFUSED(ncclReduceScatter)
REFUSED(ncclSend)
REFUSED(ncclRecv)
REFUSED(ncclGroupStart)
REFUSED(ncclGroupEnd)
