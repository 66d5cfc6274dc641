#include "engine/process_set.h"

#include "mpi/mpi_status.h"

namespace perseus {

Status OpenProcessSet(int id, std::vector<int> ranks, MPI_Comm comm, MPI_Comm world,
                      const Config& config, int lanes, LaneFactory& lane_factory, BatchDone done,
                      std::shared_ptr<ProcessSet>* out) {
  auto set = std::make_shared<ProcessSet>();
  set->id = id;
  set->ranks = std::move(ranks);
  set->knobs = InitialKnobs(config, lanes);
  set->holds[0] = Hold(set->knobs, false);
  set->holds[1] = Hold(set->knobs, true);
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &set->rank);
    Status status = MpiStatus(MPI_Comm_dup(comm, &set->negotiation_comm), "MPI_Comm_dup");
    if (status.ok()) status = MpiStatus(MPI_Comm_dup(comm, &set->p2p_comm), "MPI_Comm_dup");
    if (status.ok()) status = MpiStatus(MPI_Comm_dup(comm, &set->device_p2p_comm), "MPI_Comm_dup");
    for (int i = 0; status.ok() && i < 2 * lanes; ++i) {
      MPI_Comm lane_comm;
      status = MpiStatus(MPI_Comm_dup(comm, &lane_comm), "MPI_Comm_dup");
      if (status.ok()) (i < lanes ? set->lane_comms : set->device_comms).push_back(lane_comm);
    }
    if (!status.ok()) return status;  // the destructor frees what was made
    set->negotiator = std::make_unique<Negotiator>(set->negotiation_comm, set->ranks, set->rank,
                                                   config.cache_capacity, CarriesPayloads(config));
    set->done = done;
    set->stall = std::make_unique<StallInspector>(config, id, world, set->rank,
                                                  set->ranks);
    for (size_t i = 0; i < set->lane_comms.size(); ++i) {
      std::unique_ptr<Lane> lane;
      status = lane_factory.MakeHostLane(
          LaneSpec{static_cast<int>(i), set->lane_comms[i], set->rank, set->size(), &set->ranks, done, id},
          &lane);
      if (!status.ok()) return status;
      set->lanes.push_back(std::move(lane));
    }
  }
  *out = std::move(set);
  return Status::OK();
}

ProcessSet::~ProcessSet() {
  tuner.reset();
  lanes.clear();  // each lane finishes its queue and joins its thread
  device_lanes.clear();
  // A round still in flight here was never joined by a member that stopped answering:
  // MPI may still write into its buffers, so the negotiator is left allocated.
  if (negotiator && negotiator->active()) static_cast<void>(negotiator.release());
  negotiator.reset();
  stall.reset();
  for (MPI_Comm& c : lane_comms) MPI_Comm_free(&c);
  for (MPI_Comm& c : device_comms) MPI_Comm_free(&c);
  if (negotiation_comm != MPI_COMM_NULL) MPI_Comm_free(&negotiation_comm);
  if (p2p_comm != MPI_COMM_NULL) MPI_Comm_free(&p2p_comm);
  if (device_p2p_comm != MPI_COMM_NULL) MPI_Comm_free(&device_p2p_comm);
}

}  // namespace perseus
