"""A tiny Hugging Face Trainer job on CPU (a randomly initialised GPT-2, no download).

python hf_job.py [MAX_STEPS]
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
model = GPT2LMHeadModel(config)


class Random(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


args = TrainingArguments(
    output_dir="/tmp/hf_job_out",
    max_steps=steps,
    per_device_train_batch_size=8,
    logging_steps=5,
    report_to=[],
    save_strategy="no",
    use_cpu=True,
)
Trainer(model=model, args=args, train_dataset=Random()).train()
