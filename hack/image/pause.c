/*
 * pause: the process of a pod's sandbox container (localhost/agentrun-pause:dev, built by
 * hack/image/build.sh with `gcc -static`, FROM scratch). It holds the pod's namespaces open
 * while the pod's containers come and go, and as PID 1 of a pod that shares its process
 * namespace it reaps the orphans that end there, so they never linger as zombies.
 *
 * It waits for signals and nothing else: SIGTERM or SIGINT ends it (exit 0, what the runtime
 * expects when it stops the sandbox), SIGCHLD reaps every ended child. The signals are blocked
 * and taken with sigwaitinfo(), so none is lost between two waits; a handler is installed as
 * well because the kernel drops a signal sent to a PID 1 whose disposition is the default.
 * Same job as kubernetes' build/pause/linux/pause.c; our own code.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void ignore(int sig) { (void)sig; }

static void reap_children(void) {
    /* Every child that has ended; no child left (ECHILD) or none ended yet (0) ends the loop. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("agentrun-pause 1");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: not PID 1 of its namespace: orphans will not be reaped here\n", stderr);
    }
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGTERM);
    sigaddset(&wanted, SIGINT);
    sigaddset(&wanted, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &wanted, NULL) != 0) {
        perror("pause: sigprocmask");
        return 1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = ignore;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGTERM, &action, NULL) != 0 || sigaction(SIGINT, &action, NULL) != 0 ||
        sigaction(SIGCHLD, &action, NULL) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        int sig = sigwaitinfo(&wanted, NULL);
        if (sig < 0) {
            if (errno == EINTR) {
                continue; /* stopped and continued (SIGSTOP, SIGCONT): wait again */
            }
            perror("pause: sigwaitinfo");
            return 1;
        }
        if (sig == SIGCHLD) {
            reap_children();
            continue;
        }
        fprintf(stderr, "pause: got signal %d, exiting\n", sig);
        reap_children();
        return 0;
    }
}
