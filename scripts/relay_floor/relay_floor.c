/* The floor of a hop: bytes relayed from a port to tritonserver's and back, nothing checked.
 *
 * Measurement only (scripts/guard_cost.py --compare-http-guard): what any process in front of
 * tritonserver costs at the least (two more wakeups and two more loopback writes a request),
 * against which the HTTP guard's own work is read. It has the guard's command line
 * (--listen-port P --upstream-port U [--watch-pid PID]), listens on 127.0.0.1 only, opens one
 * upstream connection per client connection, and exits once PID is gone or on SIGTERM. It is
 * not a guard: no limit, no framing, no admission.
 *
 *     cc -O2 -o /tmp/relay_floor scripts/relay_floor/relay_floor.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536

static int peer[MAX_FD]; /* the other end of each relayed connection, or -1 */
static volatile sig_atomic_t stopping = 0;

static void on_term(int sig) { (void)sig; stopping = 1; }

static void usage(void) {
  fprintf(stderr, "usage: relay_floor --listen-port P --upstream-port U [--watch-pid PID]\n");
  exit(2);
}

static int nonblocking(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void drop(int epoll, int fd) {
  int other = peer[fd];
  epoll_ctl(epoll, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  peer[fd] = -1;
  if (other >= 0) {
    epoll_ctl(epoll, EPOLL_CTL_DEL, other, NULL);
    close(other);
    peer[other] = -1;
  }
}

static void watch(int epoll, int fd) {
  struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
  epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
}

/* Write all of buf to fd (a loopback socket: a full send buffer is waited for briefly). */
static int write_all(int fd, const char *buf, ssize_t size) {
  for (ssize_t done = 0; done < size;) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n >= 0) {
      done += n;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      usleep(100);
    } else {
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int listen_port = 0, upstream_port = 0;
  long watch_pid = 0;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    if (!strcmp(argv[i], "--listen-port")) listen_port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--upstream-port")) upstream_port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--watch-pid")) watch_pid = atol(argv[++i]);
    else usage();
  }
  if (listen_port <= 0 || upstream_port <= 0) usage();
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  signal(SIGPIPE, SIG_IGN);
  memset(peer, -1, sizeof peer);

  struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  address.sin_port = htons(listen_port);
  if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 512)) {
    perror("relay_floor: listen");
    return 1;
  }
  int epoll = epoll_create1(0);
  watch(epoll, listener);
  fprintf(stderr, "relay floor: 127.0.0.1:%d -> 127.0.0.1:%d\n", listen_port, upstream_port);

  static char buf[1 << 16];
  struct epoll_event events[256];
  while (!stopping) {
    int n = epoll_wait(epoll, events, 256, 500);
    if (n < 0 && errno != EINTR) break;
    if (watch_pid > 0 && kill((pid_t)watch_pid, 0) && errno == ESRCH) break;
    for (int i = 0; i < n; i++) {
      int fd = events[i].data.fd;
      if (fd == listener) {
        int client = accept(listener, NULL, NULL);
        if (client < 0) continue;
        int upstream = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in to = address;
        to.sin_port = htons(upstream_port);
        if (client >= MAX_FD || upstream < 0 || upstream >= MAX_FD ||
            connect(upstream, (struct sockaddr *)&to, sizeof to)) {
          close(client);
          if (upstream >= 0) close(upstream);
          continue;
        }
        nonblocking(client);
        nonblocking(upstream);
        peer[client] = upstream;
        peer[upstream] = client;
        watch(epoll, client);
        watch(epoll, upstream);
        continue;
      }
      if (peer[fd] < 0) continue; /* dropped earlier in this batch */
      ssize_t got = read(fd, buf, sizeof buf);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (got <= 0 || write_all(peer[fd], buf, got)) drop(epoll, fd);
    }
  }
  return 0;
}
