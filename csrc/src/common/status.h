// A result code plus message, carried from where an error is found to every waiter.
#ifndef PERSEUS_STATUS_H_
#define PERSEUS_STATUS_H_

#include <string>

#include "perseus/perseus.h"

namespace perseus {

struct Status {
  perseus_status_t code = PERSEUS_SUCCESS;
  std::string message;

  bool ok() const { return code == PERSEUS_SUCCESS; }
  static Status OK() { return Status(); }
  static Status Error(perseus_status_t code, std::string message) {
    Status s;
    s.code = code;
    s.message = std::move(message);
    return s;
  }
};

}  // namespace perseus

#endif  // PERSEUS_STATUS_H_
