#include "engine/config_agreement.h"

#include <string>
#include <vector>

#include "engine/autotune.h"
#include "mpi/mpi_status.h"

namespace perseus {

namespace {

// One thing the ranks must agree on: compared by `key`, shown as `shown`; `spelling`
// is `name` as this rank set it (a variable's Horovod alias where it set only that).
struct Item {
  std::string name;
  std::string spelling;
  std::string key;
  std::string shown;
  bool presence;  // only whether it is set must agree
};

std::string Shown(const std::string& value) { return value.empty() ? "unset" : value; }

// Every rank lists the same items in the same order (one binary, one table).
std::vector<Item> Items(const Config& config, bool thread_multiple) {
  std::vector<Item> items;
  const std::vector<Setting> settings = Settings(config);
  for (const Setting& s : settings) {
    const char* spelling = ConfigSpelling(s.name);
    if (s.agreement == Agreement::kValue)
      items.push_back({s.name, spelling, s.value, Shown(s.value), false});
    if (s.agreement == Agreement::kPresence)
      items.push_back({s.name, spelling, s.value.empty() ? "unset" : "set", Shown(s.value), true});
  }
  for (const Setting& s : settings) {
    if (s.agreement != Agreement::kValue) continue;
    std::string tuned = AutotuneTunes(config, s.name) ? "unset (left to PERSEUS_AUTOTUNE)" : s.value;
    items.push_back({s.name, ConfigSpelling(s.name), tuned, tuned, false});
  }
  std::string threads = thread_multiple ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED";
  items.push_back({"MPI's thread support", "MPI's thread support", threads, threads, false});
  return items;
}

constexpr size_t kParts = 3;  // an item on the wire: key, shown, spelling, each NUL-ended

std::string Encode(const std::vector<Item>& items) {
  std::string text;
  for (const Item& item : items) text += item.key + '\0' + item.shown + '\0' + item.spelling + '\0';
  return text;
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> parts;
  for (size_t start = 0, end; (end = text.find('\0', start)) != std::string::npos; start = end + 1)
    parts.push_back(text.substr(start, end - start));
  return parts;
}

// The error for item k, where rank r differs from rank 0 (parts: each rank's Encode).
Status Differs(const Item& item, size_t k, int r, const std::vector<std::vector<std::string>>& parts) {
  const std::string* at0 = &parts[0][kParts * k];
  const std::string* at_r = &parts[r][kParts * k];
  // Named as the user set it: rank 0's alias if it used one, else rank r's spelling.
  const std::string& name = at0[2] != item.name ? at0[2] : at_r[2];
  const std::string values =
      " (rank 0: " + at0[1] + ", rank " + std::to_string(r) + ": " + at_r[1] + ")";
  if (item.presence)
    return Status::Error(PERSEUS_CONFIG_ERROR,
                         name + " is set on some ranks only" + values +
                             "; set it on every rank or on none (rank 0 uses its value)");
  return Status::Error(PERSEUS_CONFIG_ERROR, name + " differs across ranks" + values +
                                                 "; every rank must use the same value");
}

}  // namespace

Status AgreeOnConfig(const Config& config, bool thread_multiple, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::vector<Item> items = Items(config, thread_multiple);
  // Values are text of any length: gather the lengths, then the texts.
  const std::string mine = Encode(items);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size);
  Status status = MpiStatus(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm),
                            "MPI_Allgather");
  if (!status.ok()) return status;
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  status = MpiStatus(MPI_Allgatherv(mine.data(), length, MPI_CHAR, &all[0], lengths.data(),
                                    offsets.data(), MPI_CHAR, comm),
                     "MPI_Allgatherv");
  if (!status.ok()) return status;

  // parts[r][kParts * k + i]: rank r's key (i = 0), shown value (1), spelling (2) of item k.
  std::vector<std::vector<std::string>> parts(size);
  for (int r = 0; r < size; ++r) parts[r] = Split(all.substr(offsets[r], lengths[r]));
  for (int r = 1; r < size; ++r)
    if (parts[r].size() != parts[0].size())
      return Status::Error(PERSEUS_CONFIG_ERROR, "rank " + std::to_string(r) +
                                                     " runs a Perseus build with a different "
                                                     "configuration table than rank 0");
  for (size_t k = 0; k < items.size(); ++k)
    for (int r = 1; r < size; ++r)
      if (parts[r][kParts * k] != parts[0][kParts * k]) return Differs(items[k], k, r, parts);
  return Status::OK();
}

}  // namespace perseus
