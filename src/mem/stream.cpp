// SPDX-License-Identifier: Apache-2.0
#include "mem/stream.h"

namespace ferry::mem {

Stream& Stream::host() {
  static Stream s;
  return s;
}

}  // namespace ferry::mem
