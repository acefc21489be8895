// A one-node Slurm cluster for a test: munged, slurmctld and slurmd (Debian's slurm-wlm and munge) on this machine,
// configured in a scratch folder (its own munge key and socket, free ports, no accounting storage), stopped by PID.
// Needs root. SLURM_CONF is set in this process, so sbatch/scontrol here and in child processes talk to it.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "child_process.h"
#include "tuner_cli.h"

namespace servetune::testing {

class SlurmCluster {
 public:
  // Why this machine cannot run the cluster ("" when it can).
  static std::string why_not() {
    if (::geteuid() != 0) return "not root (slurmd and munged run as root here)";
    for (const char* p : {"munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo"}) {
      if (!servetune_shell(std::string("command -v ") + p + " > /dev/null 2>&1")) return std::string(p) + " not found (apt-get install slurm-wlm munge)";
    }
    return "";
  }

  SlurmCluster() : dir_(scratch("slurm")) {
    std::filesystem::create_directories(dir_ / "state");
    std::filesystem::create_directories(dir_ / "spool");
    {
      std::ofstream key(dir_ / "munge.key", std::ios::binary);
      std::mt19937 rng(static_cast<unsigned>(::getpid()));
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(rng() & 0xff));
    }
    ::chmod((dir_ / "munge.key").c_str(), 0400);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string node = host;
    node = node.substr(0, node.find('.'));
    const int ctld_port = free_port_run(2);
    const std::string d = dir_.string();
    write_text(dir_ / "slurm.conf",
               "ClusterName=servetunetest\nSlurmctldHost=" + node + "(127.0.0.1)\nSlurmctldPort=" + std::to_string(ctld_port) +
                   "\nSlurmdPort=" + std::to_string(ctld_port + 1) + "\nAuthType=auth/munge\nAuthInfo=socket=" + d +
                   "/munge.sock\nCredType=cred/munge\nStateSaveLocation=" + d + "/state\nSlurmdSpoolDir=" + d +
                   "/spool\nSlurmctldPidFile=" + d + "/slurmctld.pid\nSlurmdPidFile=" + d + "/slurmd.pid\nSlurmctldLogFile=" + d +
                   "/slurmctld.log\nSlurmdLogFile=" + d +
                   "/slurmd.log\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n"
                   "SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\nSlurmUser=root\nSlurmdUser=root\n"
                   "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
                   "SchedulerParameters=sched_interval=1\nNodeName=" + node + " NodeAddr=127.0.0.1 CPUs=" +
                   std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                   " State=UNKNOWN\nPartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
    ::setenv("SLURM_CONF", (dir_ / "slurm.conf").c_str(), 1);
    started_ = servetune_shell("munged -f --socket=" + d + "/munge.sock --key-file=" + d + "/munge.key --pid-file=" + d +
                               "/munged.pid --log-file=" + d + "/munged.log --seed-file=" + d + "/munge.seed") &&
               servetune_shell("slurmctld -f " + d + "/slurm.conf") && servetune_shell("slurmd -f " + d + "/slurm.conf");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (started_ && !idle() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    started_ = started_ && idle();
  }

  ~SlurmCluster() {
    servetune_shell("scancel --partition=test > /dev/null 2>&1");
    for (const char* pid_file : {"slurmd.pid", "slurmctld.pid", "munged.pid"}) stop(dir_ / pid_file);
    ::unsetenv("SLURM_CONF");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool started() const { return started_; }
  // The daemons' logs, for a failure message.
  std::string logs() const {
    return read_text(dir_ / "slurmctld.log") + read_text(dir_ / "slurmd.log") + read_text(dir_ / "munged.log");
  }

 private:
  bool idle() const { return servetune_shell("sinfo -h -o %t 2>/dev/null | grep -qx idle"); }

  // Running, not a zombie nobody reaps (the daemons' parent is whatever PID 1 is here).
  static bool alive(pid_t pid) {
    if (::kill(pid, 0) != 0) return false;
    const std::string status = read_text("/proc/" + std::to_string(pid) + "/status");
    return status.find("State:\tZ") == std::string::npos;
  }

  static void stop(const std::filesystem::path& pid_file) {
    const pid_t pid = static_cast<pid_t>(std::atoi(read_text(pid_file).c_str()));
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 100 && alive(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(pid, SIGKILL);
  }

  std::filesystem::path dir_;
  bool started_ = false;
};

}  // namespace servetune::testing
