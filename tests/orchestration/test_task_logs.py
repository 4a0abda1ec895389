import subprocess
import sys

from mnist_dp.orchestration import task_logs


def test_output_tail_keeps_what_child_processes_print():
    child = ("import sys; print('hello', flush=True); sys.stderr.write('progress 10%\\rprogress "
             "100%\\nerror: bad batch\\n')")
    with task_logs.OutputTail() as tail:
        subprocess.run([sys.executable, "-c", child])
    # a progress bar's redraws (carriage returns) keep their last state, as on a terminal
    assert [line for line in tail.lines() if line] == ["hello", "progress 100%", "error: bad batch"]


def test_terminal_lines_read_a_tty_log_as_a_terminal_shows_it():
    # Substra's docker backend runs containers with a TTY: every line ends in CRLF.
    log = "epoch 1/2\r\nstep 3%\rstep 100%\r\nerror: bad batch\r\n"
    assert [line for line in task_logs.terminal_lines(log)
            if line] == ["epoch 1/2", "step 100%", "error: bad batch"]
