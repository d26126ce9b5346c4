/* orchard-sandbox: the small native helper of the local backend (no daemon; each call exits).
 *
 *   orchard-sandbox mount [--cgroup PROCS]... [--overlay TARGET LOWERS UPPER WORK]... -- CMD...
 *       join cgroups, enter a new mount namespace, mount overlays (LOWERS: colon list, top first),
 *       then exec CMD (bubblewrap, which builds the sandbox on the mounted root).
 *   orchard-sandbox init [READY_FD]
 *       pid 1 of a sandbox: say "ready" on READY_FD (the sandbox is fully set up once it runs),
 *       then reap children, otherwise sleep.
 *   orchard-sandbox enter PID CWD [--status-fd N] [--cgroup PROCS]... [--cgroup-new DIR] -- CMD...
 *       join cgroups and the namespaces and root of sandbox init PID, fork, and in the child drop
 *       every capability, set no_new_privs, start a new session, chdir CWD and exec CMD.
 *       A seccomp filter then forbids new user namespaces (root-in-a-userns could mount cgroupfs and
 *       lift its own limits), clone3, keyrings, bpf, perf events, userfaultfd and handle-based opens.
 *       Status lines on fd N: "pid <host pid>" (parent), "spid <sandbox pid>" (child),
 *       "err <what> <message>" (child, when CMD cannot start). The parent exits as the child did:
 *       the same code, or killed by the same signal.
 *   orchard-sandbox put PATH MODE     (run inside a sandbox by `enter`)
 *       write stdin to PATH as the sandbox's own user would, creating parents; MODE -1 keeps 0644/existing.
 *   orchard-sandbox get PATH LIMIT    (run inside a sandbox by `enter`)
 *       copy the regular file PATH to stdout. Exit codes of put/get: 2 not found, 3 not a regular
 *       file / a directory in the way, 4 larger than LIMIT, 5 other errors (message on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/stat.h>
#include <stddef.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>

static int status_fd = -1;

static void say(const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  if (n > (int)sizeof buf) n = sizeof buf;
  int fd = status_fd >= 0 ? status_fd : 2;
  if (write(fd, buf, (size_t)n) < 0) {}
}

static int fail(const char *what, const char *arg) {
  say("err %s %s: %s\n", what, arg ? arg : "", strerror(errno));
  return 125;
}

static int join_cgroup(const char *procs) {
  int fd = open(procs, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = write(fd, "0\n", 2) < 0 ? -1 : 0;
  close(fd);
  return rc;
}

/* Parse "--cgroup X", "--status-fd N", "--overlay T L U W" until "--"; return index of CMD or -1. */
static int parse(int argc, char **argv, char **overlays, int *noverlay) {
  int i = 0;
  while (i < argc && strcmp(argv[i], "--") != 0) {
    if (strcmp(argv[i], "--cgroup") == 0 && i + 1 < argc) {
      if (join_cgroup(argv[i + 1]) < 0) { fail("join cgroup", argv[i + 1]); return -1; }
      i += 2;
    } else if (strcmp(argv[i], "--cgroup-new") == 0 && i + 1 < argc) {
      char procs[4096];
      snprintf(procs, sizeof procs, "%s/cgroup.procs", argv[i + 1]);
      if ((mkdir(argv[i + 1], 0755) < 0 && errno != EEXIST) || join_cgroup(procs) < 0) {
        fail("join new cgroup", argv[i + 1]);
        return -1;
      }
      i += 2;
    } else if (strcmp(argv[i], "--status-fd") == 0 && i + 1 < argc) {
      status_fd = atoi(argv[i + 1]);
      fcntl(status_fd, F_SETFD, FD_CLOEXEC); /* never leaks into CMD */
      i += 2;
    } else if (strcmp(argv[i], "--overlay") == 0 && i + 4 < argc && overlays) {
      for (int k = 0; k < 4; k++) overlays[4 * *noverlay + k] = argv[i + 1 + k];
      (*noverlay)++;
      i += 5;
    } else {
      say("err usage unknown argument %s\n", argv[i]);
      return -1;
    }
  }
  return (i + 1 < argc) ? i + 1 : -1;
}

static int mode_mount(int argc, char **argv) {
  char **overlays = calloc((size_t)argc * 4 + 4, sizeof(char *));
  int n = 0;
  int cmd = parse(argc, argv, overlays, &n);
  if (cmd < 0) return 125;
  if (unshare(CLONE_NEWNS) < 0) return fail("unshare", "mount namespace");
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail("mount", "private /");
  for (int i = 0; i < n; i++) {
    char **o = overlays + 4 * i;
    size_t len = strlen(o[1]) + strlen(o[2]) + strlen(o[3]) + 64;
    char *opts = malloc(len);
    snprintf(opts, len, "lowerdir=%s,upperdir=%s,workdir=%s", o[1], o[2], o[3]);
    if (mount("overlay", o[0], "overlay", 0, opts) < 0) return fail("mount overlay on", o[0]);
    free(opts);
  }
  execv(argv[cmd], argv + cmd);
  return fail("exec", argv[cmd]);
}

static int mode_init(int ready_fd) {
  if (ready_fd >= 0) {
    if (write(ready_fd, "ready\n", 6) < 0) {}
    close(ready_fd);
  }
  for (int fd = 3; fd < 1024; fd++) close(fd);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  prctl(PR_SET_NAME, "orchard-init", 0, 0, 0);
  for (;;) {
    if (waitpid(-1, NULL, 0) < 0 && errno == ECHILD) {
      int sig;
      sigwait(&all, &sig); /* no children: sleep until a signal (SIGCHLD) arrives */
    }
  }
  return 0;
}

static int join_ns(int pid, const char *ns, int type) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/%s", pid, ns);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, type);
  close(fd);
  return rc;
}

static int drop_privileges(void) {
  if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
            SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) < 0) return -1;
  for (int cap = 0; cap <= 63; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return -1;
  }
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof data);
  if (syscall(SYS_capset, &hdr, data) < 0) return -1;
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

#if defined(__x86_64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_AARCH64
#endif

#define DENY(nr, err) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err))

static int install_seccomp(void) {
#ifdef AUDIT_ARCH_NATIVE
  struct sock_filter filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_NATIVE, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    /* unshare(flags) and clone(flags, ...): refuse CLONE_NEWUSER */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 3),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWUSER, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    DENY(__NR_clone3, ENOSYS),          /* flags live in memory BPF cannot read: libc falls back to clone */
    DENY(__NR_keyctl, EPERM), DENY(__NR_add_key, EPERM), DENY(__NR_request_key, EPERM),
    DENY(__NR_bpf, EPERM), DENY(__NR_perf_event_open, EPERM), DENY(__NR_userfaultfd, EPERM),
    DENY(__NR_open_by_handle_at, EPERM), DENY(__NR_name_to_handle_at, EPERM),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
#else
  return 0;
#endif
}

static int child_main(const char *cwd, char **cmd) {
  setsid();
  if (isatty(0)) ioctl(0, TIOCSCTTY, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int s = 1; s < 32; s++) signal(s, SIG_DFL);
  if (drop_privileges() < 0) return fail("drop", "privileges");
  if (install_seccomp() < 0) return fail("install", "seccomp filter");
  if (chdir(cwd) < 0) {
    say("err cwd %s: %s\n", cwd, strerror(errno));
    return 125;
  }
  say("spid %d\n", (int)getpid());
  execvp(cmd[0], cmd);
  int err = errno;
  say("err exec %s: %s\n", cmd[0], strerror(err));
  return err == ENOENT ? 127 : 126;
}

static pid_t child;
static void forward(int sig) { if (child > 0) kill(child, sig); }

static int mode_enter(int argc, char **argv) {
  if (argc < 4) return fail("usage", "enter PID CWD ... -- CMD");
  int pid = atoi(argv[0]);
  const char *cwd = argv[1];
  int cmd = parse(argc - 2, argv + 2, NULL, NULL);
  if (cmd < 0) return 125;
  char **command = argv + 2 + cmd;
  char rootpath[64];
  snprintf(rootpath, sizeof rootpath, "/proc/%d/root", pid);
  int rootfd = open(rootpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return fail("open", rootpath);
  if (join_ns(pid, "ipc", CLONE_NEWIPC) < 0) return fail("join", "ipc namespace");
  if (join_ns(pid, "uts", CLONE_NEWUTS) < 0) return fail("join", "uts namespace");
  if (join_ns(pid, "net", CLONE_NEWNET) < 0) return fail("join", "net namespace");
  if (join_ns(pid, "pid", CLONE_NEWPID) < 0) return fail("join", "pid namespace");
  if (join_ns(pid, "mnt", CLONE_NEWNS) < 0) return fail("join", "mount namespace");
  if (fchdir(rootfd) < 0 || chroot(".") < 0) return fail("chroot", rootpath);
  close(rootfd);
  signal(SIGTERM, forward);
  signal(SIGINT, forward);
  signal(SIGHUP, forward);
  child = fork();
  if (child < 0) return fail("fork", "");
  if (child == 0) _exit(child_main(cwd, command));
  say("pid %d\n", (int)child);
  if (status_fd >= 0) close(status_fd);
  int status;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return fail("wait", "");
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    kill(getpid(), sig);
    return 128 + sig;
  }
  return WEXITSTATUS(status);
}

static int mkparents(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir(path, 0755);
    int err = errno;
    *p = '/';
    if (rc < 0 && err != EEXIST) { errno = err; return -1; }
  }
  return 0;
}

static int io_fail(const char *what, const char *path) {
  int err = errno;
  fprintf(stderr, "%s %s: %s\n", what, path, strerror(err));
  if (err == ENOENT || err == ENOTDIR) return 2;
  if (err == EISDIR) return 3;
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return 4;
  return 5;
}

static int copy(int in, int out, long long limit, long long *copied) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0) { if (errno == EINTR) continue; return -1; }
    *copied += n;
    if (limit >= 0 && *copied > limit) return 1;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(out, buf + off, (size_t)(n - off));
      if (w < 0) { if (errno == EINTR) continue; return -1; }
      off += w;
    }
  }
}

static int mode_put(char *path, long mode) {
  if (mkparents(path) < 0) return io_fail("create parents of", path);
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, mode >= 0 ? (mode_t)mode : 0644);
  if (fd < 0) return io_fail("open", path);
  struct stat st;
  if (fstat(fd, &st) < 0) return io_fail("stat", path);
  if (!S_ISREG(st.st_mode)) { fprintf(stderr, "%s is not a regular file\n", path); return 3; }
  if (ftruncate(fd, 0) < 0) return io_fail("truncate", path);
  fcntl(fd, F_SETFL, 0);
  long long copied = 0;
  if (copy(0, fd, -1, &copied) < 0) return io_fail("write", path);
  if (mode >= 0 && fchmod(fd, (mode_t)mode) < 0) return io_fail("chmod", path);
  if (close(fd) < 0) return io_fail("close", path);
  return 0;
}

static int mode_get(const char *path, long long limit) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_fail("open", path);
  struct stat st;
  if (fstat(fd, &st) < 0) return io_fail("stat", path);
  if (S_ISDIR(st.st_mode)) { fprintf(stderr, "%s is a directory\n", path); return 3; }
  if (!S_ISREG(st.st_mode)) { fprintf(stderr, "%s is not a regular file\n", path); return 3; }
  if (st.st_size > limit) { fprintf(stderr, "%s is %lld bytes\n", path, (long long)st.st_size); return 4; }
  fcntl(fd, F_SETFL, 0);
  long long copied = 0;
  int rc = copy(fd, 1, limit, &copied);
  if (rc < 0) return io_fail("read", path);
  if (rc > 0) { fprintf(stderr, "%s grew past %lld bytes\n", path, limit); return 4; }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "put") == 0) return mode_put(argv[2], strtol(argv[3], NULL, 10));
  if (argc == 4 && strcmp(argv[1], "get") == 0) return mode_get(argv[2], strtoll(argv[3], NULL, 10));
  if (argc >= 2 && strcmp(argv[1], "init") == 0) return mode_init(argc >= 3 ? atoi(argv[2]) : -1);
  if (argc >= 3 && strcmp(argv[1], "mount") == 0) return mode_mount(argc - 2, argv + 2);
  if (argc >= 3 && strcmp(argv[1], "enter") == 0) return mode_enter(argc - 2, argv + 2);
  fprintf(stderr, "usage: orchard-sandbox init | mount ... -- CMD | enter PID CWD ... -- CMD\n");
  return 2;
}
