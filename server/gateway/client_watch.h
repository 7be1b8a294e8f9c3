// Notices an HTTP client that went away while its handler waits on the backend (before a streamed
// response has begun, or for a whole non-streamed one). cpp-httplib 0.11 does not hand its socket
// to handlers, so the watch finds it among this process's descriptors by the connection's addresses
// (unique while the connection is open, and the handler runs inside it), then polls it for the
// peer's close. Streams already sending use httplib's DataSink::is_writable instead.
#pragma once

#include <httplib.h>

namespace kimi::gateway {

class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& request);
  // True once the client has closed or reset the connection. False if the socket was not found.
  bool Gone() const;

 private:
  int fd_ = -1;
};

}  // namespace kimi::gateway
