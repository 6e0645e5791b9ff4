"""A job with named threads that prints a step every 0.1 s until killed."""

import threading
import time


def grad_worker() -> None:
    while True:
        time.sleep(0.05)


def data_loader() -> None:
    while True:
        sum(range(2000))
        time.sleep(0.01)


threading.Thread(target=grad_worker, name="grad-worker-0", daemon=True).start()
threading.Thread(target=data_loader, name="data-loader", daemon=True).start()
step = 0
while True:
    step += 1
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.1)
