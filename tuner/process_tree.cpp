// Process and socket facts from /proc (see process_tree.h).
#include "tuner/process_tree.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

// Reads a decimal number at p (no sign), advancing p; false when there is none.
bool read_number(const char*& p, const char* end, uint64_t& out) {
  if (p >= end || *p < '0' || *p > '9') return false;
  out = 0;
  while (p < end && *p >= '0' && *p <= '9') out = out * 10 + static_cast<uint64_t>(*p++ - '0');
  return true;
}

bool skip_field(const char*& p, const char* end) {
  while (p < end && *p == ' ') ++p;
  if (p >= end) return false;
  while (p < end && *p != ' ') ++p;
  return true;
}

bool is_pid_name(const std::string& name) {
  return !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
}

// The inodes of listening TCP sockets on `port` in one /proc/net/tcp* table.
void listening_inodes(const char* table, int port, std::set<std::string>& inodes) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode)) continue;
    const size_t colon = local.rfind(':');
    if (state != "0A" || colon == std::string::npos) continue;  // 0A: TCP_LISTEN
    if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) inodes.insert(inode);
  }
}

}  // namespace

bool parse_proc_stat(const char* text, size_t size, ProcessStat& out) {
  const char* end = text + size;
  const char* p = text;
  uint64_t v = 0;
  if (!read_number(p, end, v)) return false;
  out.pid = static_cast<pid_t>(v);
  const char* close = nullptr;  // comm ends at the last ')'
  for (const char* q = p; q < end; ++q) {
    if (*q == ')') close = q;
  }
  if (close == nullptr) return false;
  p = close + 1;
  if (!skip_field(p, end)) return false;  // state (field 3)
  uint64_t fields[3] = {};                // ppid, pgrp, session (fields 4-6)
  for (uint64_t& f : fields) {
    while (p < end && *p == ' ') ++p;
    if (!read_number(p, end, f)) return false;
  }
  for (int field = 7; field < 22; ++field) {
    if (!skip_field(p, end)) return false;
  }
  while (p < end && *p == ' ') ++p;
  if (!read_number(p, end, out.start_ticks)) return false;
  out.ppid = static_cast<pid_t>(fields[0]);
  out.pgid = static_cast<pid_t>(fields[1]);
  out.sid = static_cast<pid_t>(fields[2]);
  return true;
}

std::optional<ProcessStat> read_process_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  ProcessStat s;
  if (!parse_proc_stat(text.data(), text.size(), s)) return std::nullopt;
  return s;
}

std::vector<ProcessStat> all_process_stats() {
  std::vector<ProcessStat> out;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_pid_name(name)) continue;
    if (auto s = read_process_stat(static_cast<pid_t>(std::stol(name)))) out.push_back(*s);
  }
  return out;
}

std::vector<pid_t> descendants_of(pid_t root, const std::vector<ProcessStat>& all) {
  std::set<pid_t> found{root};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& s : all) {
      if (!found.count(s.pid) && found.count(s.ppid)) grew = found.insert(s.pid).second || grew;
    }
  }
  found.erase(root);
  return {found.begin(), found.end()};
}

std::vector<pid_t> tcp_port_listeners(int port) {
  std::set<std::string> inodes;
  listening_inodes("/proc/net/tcp", port, inodes);
  listening_inodes("/proc/net/tcp6", port, inodes);
  std::set<std::string> links;
  for (const auto& inode : inodes) links.insert("socket:[" + inode + "]");
  std::vector<pid_t> pids;
  if (links.empty()) return pids;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_pid_name(name)) continue;
    std::error_code fd_ec;
    for (fs::directory_iterator fd(it->path() / "fd", fd_ec), fd_end; !fd_ec && fd != fd_end; fd.increment(fd_ec)) {
      std::error_code link_ec;
      const fs::path target = fs::read_symlink(fd->path(), link_ec);
      if (!link_ec && links.count(target.string())) {
        pids.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
    }
  }
  return pids;
}

std::string describe_process(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
  for (char& c : cmd) c = c == '\0' ? ' ' : c;
  if (cmd.size() > 120) cmd = cmd.substr(0, 117) + "...";
  return "pid " + std::to_string(pid) + (cmd.empty() ? "" : " (" + cmd + ")");
}

bool tcp_port_accepts(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) != 0) return false;
  bool accepted = false;
  for (addrinfo* a = list; a != nullptr && !accepted; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      accepted = ::poll(&p, 1, timeout_ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(list);
  return accepted;
}

}  // namespace servetune::tuner
