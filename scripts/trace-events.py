#!/usr/bin/env python3
"""scripts/trace-events.py: reduce scripts/trace-events' ftrace output.

  scripts/trace-events.py TRACE:COMM [TRACE:COMM ...]
  scripts/trace-events.py --poll TRACE:COMM [TRACE:COMM ...]

COMM is the process name (ibv_rc_pingpong, goverbs). A half trip is one
rxe_post_send of COMM to the next (the two processes alternate); the first
and last 20 are dropped. Per half trip it prints medians of: doorbell to
event raised (ib_uverbs_comp_handler), sched_waking of the peer to it
running, running to its next doorbell; syscalls by kind, context switches,
wake-ups by source (tasklet = completion event, hardirq = timer, task =
futex and the like); and, with raw_syscalls traced, the peer's syscall time
between running and its doorbell. docs/perf.md, "Twelfth session".

--poll (traces of scripts/trace-events --poll): a half trip is one
doorbell (rxe_post_send) to the next one by the other process (by tgid);
it is split into the doorbell's own kernel time (entry to return), the
kernel's delivery (doorbell to the first rxe_cq_post after it: the
peer's receive completion written, in the sender's context) and the
peer's reaction (that completion to its doorbell); with uprobes, the
reaction is split further at bx's received, respond and Call and the
driver's PostSend, the first of each in the peer after the completion.
docs/perf.md, "Thirteenth session".
"""
import collections
import re
import statistics as st
import sys

LINE = re.compile(r'^\s*(.+?)-(\d+)\s+(?:\(\s*([-\d]+)\)\s+)?\[(\d+)\]\s+(\S+)\s+([\d.]+):\s+(\S+):\s*(.*)$')
NR = {0: 'read', 1: 'write', 7: 'poll', 16: 'ioctl', 24: 'sched_yield', 35: 'nanosleep',
      39: 'getpid', 202: 'futex', 232: 'epoll_wait', 234: 'tgkill', 281: 'epoll_pwait',
      44: 'sendto', 45: 'recvfrom', 46: 'sendmsg', 47: 'recvmsg', 230: 'clock_nanosleep'}


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                comm, tid, tgid, cpu, flags, t, name, rest = m.groups()
                tgid = int(tgid) if tgid and tgid.strip('-') else int(tid)
                ev.append((float(t) * 1e6, comm, int(tid), int(cpu), flags, name, rest, tgid))
    return ev


def q(x):
    return '%.0f' % st.median(x) if x else '-'


def analyze(path, comm):
    ev = load(path)
    c15 = comm[:15]
    mine = lambda e: e[1].startswith(c15)
    db = [i for i, e in enumerate(ev) if e[5] == 'postsend' and mine(e)][20:-20]
    ph = collections.defaultdict(list)
    sysc = collections.Counter()
    other = collections.Counter()
    peer = collections.defaultdict(list)
    halves = 0
    for a, b in zip(db, db[1:]):
        halves += 1
        ph['half trip'].append(ev[b][0] - ev[a][0])
        for e in ev[a:b]:
            if e[5] == 'sys_enter' and mine(e):
                nr = int(e[6].split()[1])
                sysc[NR.get(nr, str(nr))] += 1
            elif e[5] == 'sched_switch':
                other['context switches'] += 1
            elif e[5] == 'sched_waking':
                src = 'timer (hardirq)' if 'h' in e[4] else 'completion event (softirq)' if 's' in e[4] else 'task (futex...)'
                other['wake-ups from ' + src] += 1
        ci = next((i for i in range(a, b) if ev[i][5] == 'comph'), None)
        if ci is None:
            continue
        wi = next((i for i in range(ci, b) if ev[i][5] == 'sched_waking' and 's' in ev[i][4]
                   and ('comm=' + c15) in ev[i][6]), None)
        if wi is None:
            continue
        wt = int(re.search(r' pid=(\d+)', ev[wi][6]).group(1))
        si = next((i for i in range(wi, b + 1) if ev[i][5] == 'sched_switch'
                   and ('next_pid=%d ' % wt) in ev[i][6]), None)
        if si is None:
            continue
        ph['doorbell -> event raised'].append(ev[ci][0] - ev[a][0])
        ph['waking -> peer running'].append(ev[si][0] - ev[wi][0])
        ph['peer running -> its doorbell'].append(ev[b][0] - ev[si][0])
        tc = int(re.search(r'target_cpu=(\d+)', ev[wi][6]).group(1))
        other['peer woken on the waker\'s cpu'] += tc == ev[wi][3]
        acc = collections.Counter()
        open_ = None
        for e in ev[si:b + 1]:
            if e[2] != wt:
                continue
            if e[5] == 'sys_enter':
                open_ = (int(e[6].split()[1]), e[0])
            elif e[5] == 'sys_exit' and open_:
                acc[NR.get(open_[0], str(open_[0]))] += e[0] - open_[1]
                open_ = None
        for k, v in acc.items():
            peer[k].append(v)
    print('== %s (%s): %d half trips' % (path, comm, halves))
    for k in ('doorbell -> event raised', 'waking -> peer running', 'peer running -> its doorbell', 'half trip'):
        print('  %-32s median %s us (n=%d)' % (k, q(ph[k]), len(ph[k])))
    if halves:
        print('  per half trip: syscalls %.1f (%s)' % (sum(sysc.values()) / halves,
              ', '.join('%s %.2f' % (k, v / halves) for k, v in sysc.most_common())))
        print('  per half trip: ' + ', '.join('%s %.2f' % (k, v / halves) for k, v in sorted(other.items())))
    for k, v in sorted(peer.items()):
        print('  peer syscall %-12s median %s us, in %d of %d half trips' % (k, q(v), len(v), halves))


UPROBES = ('u_received', 'u_respond', 'u_call', 'u_postsend')


def analyze_poll(path, comm):
    ev = load(path)
    c15 = comm[:15]
    db = [i for i, e in enumerate(ev) if e[5] == 'postsend' and e[1].startswith(c15)][20:-20]
    deep = any(e[5] == 'k_veth_xmit' for e in ev)
    ph = collections.defaultdict(list)
    halves = same = 0
    for a, b in zip(db, db[1:]):
        if ev[a][7] == ev[b][7]:
            same += 1  # a second doorbell of the same process (credit update, ack)
            continue
        halves += 1
        t0, peer = ev[a][0], ev[b][7]
        ph['half trip (doorbell -> peer\'s doorbell)'].append(ev[b][0] - t0)
        r = next((i for i in range(a, b) if ev[i][5] == 'postret' and ev[i][2] == ev[a][2]), None)
        if r is not None:
            ph['doorbell entry -> return (sender)'].append(ev[r][0] - t0)
        # The sender's packet: rxe runs the requester in the doorbell's
        # process context, and veth hands the packet to NET_RX on the same
        # CPU, so the packet comes in (rxe_rcv) and the peer's receive
        # completion is written (rxe_cq_post) on the sender's CPU in the
        # sender's context. Events of other CPUs are the peer's doorbell
        # still running (its ACK, its own completions): the first rxe_rcv
        # or rxe_cq_post anywhere is not the sender's packet (the twelfth
        # and thirteenth sessions' split took it for it). With --deep, the
        # packet is the first rxe_rcv after the sender's veth_xmit.
        cpu, snd = ev[a][3], ev[a][7]
        on = lambda i, name: ev[i][5] == name and ev[i][3] == cpu and ev[i][7] == snd
        x = a
        if deep:
            x = next((i for i in range(a, b) if on(i, 'k_veth_xmit')), None)
            if x is None:
                continue
            ph['  doorbell -> veth_xmit (the packet leaves)'].append(ev[x][0] - t0)
        rv = next((i for i in range(x, b) if on(i, 'rcv')), None)
        c = next((i for i in range(rv, b) if on(i, 'cqpost')), None) if rv is not None else None
        if c is None:
            continue
        ph['doorbell -> peer\'s completion written'].append(ev[c][0] - t0)
        if rv is not None:
            ph['  doorbell -> packet in (rxe_rcv)'].append(ev[rv][0] - t0)
            ph['  packet in -> completion written'].append(ev[c][0] - ev[rv][0])
        # --deep: rxe's task probes between the doorbell and the packet in,
        # as offsets from the doorbell (the first of each, and how many).
        seen = collections.Counter()
        for e in ev[a:rv]:
            if e[3] != cpu:
                continue
            if e[5].startswith('k_'):
                if not seen[e[5]]:
                    ph['  doorbell -> first %s' % e[5][2:]].append(e[0] - t0)
                seen[e[5]] += 1
        for k, v in seen.items():
            ph['  %s calls before the packet is in' % k[2:]].append(v)
        ph['completion -> peer\'s doorbell'].append(ev[b][0] - ev[c][0])
        last, lastname = ev[c][0], 'completion'
        for u in UPROBES:
            i = next((i for i in range(c, b) if ev[i][5] == u and ev[i][7] == peer), None)
            if i is None:
                continue
            ph['%s -> %s' % (lastname, u[2:])].append(ev[i][0] - last)
            last, lastname = ev[i][0], u[2:]
        if lastname != 'completion':
            ph['%s -> doorbell' % lastname].append(ev[b][0] - last)
        for e in ev[c:b]:
            if e[5] == 'sched_switch':
                ph['context switches'].append(1)
    print('== %s (%s): %d half trips (%d doorbells followed by one of the same process skipped)' % (path, comm, halves, same))
    for k, v in ph.items():
        if k == 'context switches':
            print('  context switches between completion and doorbell: %.2f per half trip' % (len(v) / max(halves, 1)))
        else:
            print('  %-44s median %6s us, mean %6.0f (n=%d)' % (k, q(v), st.mean(v), len(v)))


if __name__ == '__main__':
    args = sys.argv[1:]
    poll = args[:1] == ['--poll']
    if poll:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    for arg in args:
        path, _, comm = arg.rpartition(':')
        (analyze_poll if poll else analyze)(path, comm)
