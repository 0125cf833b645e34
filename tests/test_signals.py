"""SIGINT and SIGTERM reach a command however the run treats the first delivery (hashdist/cli/signals.py).

Each case runs a small script in a new process: it enters SignalWatch, signals itself, and then does what
the run's libraries sometimes do with the exception: drop it in a garbage-collector callback, wrap it in an
ordinary error from compiled code, or let another handler (Prefect's, for SIGTERM) take the signal. The
command must still end with the signal's status, its cleanup finished.
"""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

PRELUDE = """
import gc, os, signal, sys, time
from hashdist.cli.signals import SignalWatch, exit_within

def command(run, grace=None):
    # a command as the CLI's main() runs one: the signal's status if one ended it (or came meanwhile); with
    # grace, the process ended as cli.console ends it
    with SignalWatch() as signals:
        try:
            run()
        except BaseException as exc:
            ending = signals.ending(exc)
        else:
            ending = signals.ending()
    print(f"ended {ending[1]}" if ending else "ended normally", flush=True)
    if ending and grace:
        exit_within(grace, ending[0])
    sys.exit(ending[0] if ending else 0)

def work(seconds):  # a run that goes on: bounded
    for _ in range(int(seconds / 0.05)):
        time.sleep(0.05)
"""

# each case: the body of run() and what it prints on the way
CASES = {
    # the first delivery dropped as a gc callback drops it; the next one, a second later, stops the run
    "dropped_in_a_gc_callback": ("""
        def callback(phase, info):
            if phase == "start":
                gc.callbacks.remove(callback)
                os.kill(os.getpid(), SIG)
                for _ in range(100):  # the handler runs at one of these bytecodes, inside the callback
                    pass
        gc.callbacks.append(callback)
        gc.collect()
        print("went on", flush=True)
        work(20)
    """, "went on"),
    # compiled code calling back into Python turns the interrupt into an ordinary error
    "wrapped_in_an_error": ("""
        try:
            os.kill(os.getpid(), SIG)
            work(20)
        except BaseException as exc:
            raise RuntimeError("Error calling function `_ser_model`") from exc
    """, ""),
    # another handler takes the signal and does nothing (then gives the watch's back, as Prefect's bridge does)
    "taken_by_another_handler": ("""
        mine = signal.signal(SIG, lambda *args: None)
        os.kill(os.getpid(), SIG)
        work(0.3)
        signal.signal(SIG, mine)
        print("went on", flush=True)
        work(20)
    """, "went on"),
    # deliveries while the run unwinds do not cut its cleanup short
    "cleanup_not_interrupted": ("""
        try:
            os.kill(os.getpid(), SIG)
            work(20)
        finally:
            work(2.5)  # two or three deliveries come meanwhile
            print("cleaned up", flush=True)
    """, "cleaned up"),
    # a signal that comes as the command finishes: it finishes, and exits with the signal's status
    "after_the_work": ("""
        mine = signal.signal(SIG, lambda *args: None)
        os.kill(os.getpid(), SIG)
        signal.signal(SIG, mine)
    """, ""),
}

@pytest.mark.parametrize(("sig", "status", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                     (signal.SIGTERM, 143, "terminated")], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_signal_ends_the_command_however_the_first_delivery_went(case, sig, status, word):
    body, printed = CASES[case]
    script = (PRELUDE + f"SIG = signal.{sig.name}\ndef run():\n" + textwrap.indent(textwrap.dedent(body), "    ")
              + "command(run)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == status, (run.stdout, run.stderr)
    assert run.stdout.splitlines()[-1] == f"ended {word}", run.stdout
    assert printed in run.stdout, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr or case == "dropped_in_a_gc_callback", run.stderr


def test_the_watch_does_nothing_outside_the_main_thread():
    script = PRELUDE + textwrap.dedent("""
        import threading
        def run():
            with SignalWatch() as signals:
                assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            print("ok", flush=True)
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_a_command_ended_by_a_signal_exits_even_if_a_thread_of_the_run_hangs():
    """A run cut short can leave a thread that never ends (a cluster half started): the process exits all the
    same, EXIT_GRACE_S after the command (here 1 s)."""
    script = PRELUDE + textwrap.dedent("""
        import threading
        def run():
            threading.Thread(target=work, args=(120,)).start()  # not a daemon: the interpreter waits for it
            os.kill(os.getpid(), signal.SIGTERM)
            work(20)
        command(run, grace=1)
    """)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 143 and run.stdout.strip() == "ended terminated", (run.stdout, run.stderr)
    assert "still running 1 s after the command ended" in run.stderr
    assert time.monotonic() - started < 30
