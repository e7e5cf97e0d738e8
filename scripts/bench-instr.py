#!/usr/bin/env python3
"""Report of scripts/bench-instr: per variant and process, the instructions
one more call costs (callgrind's self counts of the N2-call run minus the
N1-call run, over N2-N1), in groups, and the message group's heaviest
functions.

    bench-instr.py [--top K] [--bin PATH] [--base-bin PATH] OUTDIR N1 N2 VARIANT...

With --bin (and --base-bin for the variant base), also each process's code
footprint per call: the functions that run at least once in most calls
(5 or more instructions per call) and the bytes of machine code they hold
(`go tool nm -size`). Under TCG a round trip's kernel legs lengthen with
the code the process runs between its doorbells (docs/perf.md,
"Twenty-eighth session"), so this is a second figure to cut, next to the
instructions.
"""
import argparse
import re
import subprocess
import sys

MESSAGE = re.compile(r'^github\.com/goverbs/goverbs/(bx|flow|mr|wr|uverbs|cq|qp|ioctl|internal/uvobj)[./]'
                     r'|^runtime\.(memmove|memclrNoHeapPointers)$')
TIMERS = re.compile(r'nanotime|walltime|^time\.|timer|Timer|^runtime\.(\(\*timers?\)|checkTimers)')
SCHED = re.compile(r'^(gogo|runtime\.(lock2|unlock2|lockWithRank|unlockWithRank|stealWork|findRunnable\w*|schedule|execute'
                   r'|casgstatus|casGToWaiting\w*|netpoll\w*|mcall|park_m|goschedImpl|gosched_m|Gosched|wakep|runq\w+|globrunq\w+'
                   r'|pidle\w+|ready\w*|goready\w*|gopark|selectgo|sellock|selunlock|acquireSudog|releaseSudog|chan\w+'
                   r'|selectnb\w+|recv|send|sem\w+|futex\w*|note\w+|startm|stopm|handoffp|checkdead|incidlelocked|mput|mget'
                   r'|resetspinning|procyield\w*|osyield\w*|usleep\w*|sysmon|retake|exitsyscall\w*|entersyscall\w*'
                   r'|reentersyscall|\(\*m\)\.\w+|injectglist|mstart\w*|goexit\w*|newproc\w*|gfget|gfput|wirep|releasep\w*'
                   r'|acquirep|dropg|readgstatus|nanospin)(\.abi0)?'
                   r'|(internal/)?sync\.(\(\*Mutex\)\.(lockSlow|unlockSlow)|runtime_\w+)'
                   r'|internal/runtime/syscall/linux\.Syscall6)$')


def selfcounts(path):
    """Function -> self instructions, from callgrind_annotate."""
    out = subprocess.run(['callgrind_annotate', '--threshold=100', '--auto=no', '--tree=none', '--inclusive=no', path],
                         capture_output=True, text=True, check=True).stdout
    counts, started = {}, False
    for line in out.splitlines():
        if 'file:function' in line:
            started = True
            continue
        m = re.match(r'\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S+)', line) if started else None
        if not m:
            continue
        name = m.group(2)
        name = name.split(':', 1)[1] if ':' in name else name
        name = re.sub(r"'\d+$", '', name)  # callgrind's recursion depth
        counts[name] = counts.get(name, 0) + int(m.group(1).replace(',', ''))
    return counts


def code_sizes(binary):
    """Function -> bytes of machine code, from go tool nm -size."""
    out = subprocess.run(['go', 'tool', 'nm', '-size', binary], capture_output=True, text=True, check=True).stdout
    sizes = {}
    for line in out.splitlines():
        f = line.split(None, 3)
        if len(f) == 4 and f[2] in ('T', 't'):
            sizes[f[3]] = int(f[1])
    return sizes


def group(name):
    if MESSAGE.search(name):
        return 'message'
    if SCHED.search(name):
        return 'sched'
    if TIMERS.search(name):
        return 'timers'
    return 'other'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--top', type=int, default=15)
    ap.add_argument('--bin', help='the binary of every variant but base (for the code footprint)')
    ap.add_argument('--base-bin', help="the variant base's binary")
    ap.add_argument('out')
    ap.add_argument('n1', type=int)
    ap.add_argument('n2', type=int)
    ap.add_argument('variants', nargs='+')
    a = ap.parse_args()
    calls = a.n2 - a.n1
    groups = ['message', 'sched', 'timers', 'other']
    print(f'instructions per call (callgrind, {a.n2} minus {a.n1} calls, one process at a time under valgrind, its peer native)')
    sizes = {}
    if a.bin:
        sizes['*'] = code_sizes(a.bin)
    if a.base_bin:
        sizes['base'] = code_sizes(a.base_bin)
    foot = ' functions  code KiB' if sizes else ''
    print(f'{"variant":<24} {"process":<8} {"total":>8} ' + ' '.join(f'{g:>8}' for g in groups) + foot)
    per = {}
    for v in a.variants:
        for side in ('cli', 'srv'):
            try:
                c1 = selfcounts(f'{a.out}/{v}.{a.n1}.{side}.cg')
                c2 = selfcounts(f'{a.out}/{v}.{a.n2}.{side}.cg')
            except (OSError, subprocess.CalledProcessError) as err:
                print(f'{v:<24} {side:<8} missing: {err}')
                continue
            d = {k: (c2.get(k, 0) - c1.get(k, 0)) / calls for k in set(c1) | set(c2)}
            per[(v, side)] = d
            g = {x: 0.0 for x in groups}
            for k, x in d.items():
                g[group(k)] += x
            line = f'{v:<24} {side:<8} {sum(d.values()):8.0f} ' + ' '.join(f'{g[x]:8.0f}' for x in groups)
            sz = sizes.get('base' if v == 'base' else '*')
            if sz is not None and v != 'ibv':  # ibv_rc_pingpong is C: no Go symbols
                hot = [k for k, x in d.items() if x >= 5]
                line += f' {len(hot):9d} {sum(sz.get(k, sz.get(k + ".abi0", 0)) for k in hot) / 1024:9.1f}'
            print(line)
    for (v, side), d in per.items():
        # ibv_rc_pingpong is C (libibverbs, the rxe provider, libc): all
        # of it is "other"; its heaviest functions of any group are listed.
        rows = sorted(((x, k) for k, x in d.items() if v == 'ibv' or group(k) == 'message'), reverse=True)[:a.top]
        what = 'functions' if v == 'ibv' else "message group's heaviest functions"
        print(f'\n{v} {side}: the {what} (self, per call)')
        for x, k in rows:
            print(f'  {x:7.0f}  {k.replace("github.com/goverbs/goverbs/", "")}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
