// "[a, b, c]": how messages print shapes and rank lists.
#ifndef PERSEUS_COMMON_LIST_STRING_H_
#define PERSEUS_COMMON_LIST_STRING_H_

#include <sstream>
#include <string>
#include <vector>

namespace perseus {

template <typename T>
std::string ListString(const std::vector<T>& items) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i];
  out << "]";
  return out.str();
}

}  // namespace perseus

#endif  // PERSEUS_COMMON_LIST_STRING_H_
