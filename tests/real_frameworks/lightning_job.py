"""A tiny Lightning job on CPU with its default progress bar (Rich when rich is installed).

python lightning_job.py [CRASH_AT_GLOBAL_STEP]
"""

import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

CRASH_AT = int(sys.argv[1]) if len(sys.argv) > 1 else -1


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)

    def training_step(self, batch, _idx):
        if self.global_step == CRASH_AT:
            raise RuntimeError(f"injected crash at global step {CRASH_AT}")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        import time

        time.sleep(0.05)  # the job's own pace: a step's work
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False)
trainer.fit(Tiny(), DataLoader(data, batch_size=32))
print("trainer global_step", trainer.global_step)
