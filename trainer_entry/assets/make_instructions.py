"""Generate ``instructions.jsonl``: the small instruction dataset tunematrix ships.

Run from the repository root: ``python trainer_entry/assets/make_instructions.py``.
The output is committed; this script documents where it came from and makes
it reproducible (a fixed seed, no randomness from elsewhere). All text here is
written for this project. Records have the Alpaca-style fields ``instruction``,
``input`` and ``output``; lengths vary from a few words to a few hundred so that
padding and packing behave as they do on real data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "instructions.jsonl"

EXPLANATIONS = {
    "gradient accumulation": "Gradient accumulation runs several small forward and backward passes and adds up their gradients before the optimizer takes one step. It lets a job reach a large effective batch size when only a small batch fits in device memory. The price is time: the optimizer steps less often, and each step waits for all the micro-batches to finish.",
    "the effective batch size": "The effective batch size is the number of sequences that contribute to one optimizer step. It is the per-device batch size multiplied by the number of gradient accumulation steps and by the number of devices. Two runs with the same effective batch size see the same amount of data per update, even if they split it differently across devices.",
    "data parallel training": "In data parallel training every device holds a full copy of the model and works on a different slice of the batch. After the backward pass the devices average their gradients with an all-reduce, so every copy applies the same update. It scales well while the model fits on one device, and the communication cost grows with the number of parameters.",
    "fully sharded data parallel training": "Fully sharded data parallel training splits the parameters, gradients and optimizer state across devices. Before a layer runs, its parameters are gathered from all devices, and they are freed again after use. This lets a model that does not fit on one device train on several, at the cost of more communication than plain data parallel training.",
    "LoRA": "LoRA freezes the weights of a pretrained model and learns a small low-rank update for selected layers. Each adapted layer gains two thin matrices whose product is added to the frozen weight. Because only the thin matrices are trained, the optimizer state is tiny and many adapters can be stored for one base model.",
    "QLoRA": "QLoRA combines LoRA with a base model stored in four-bit precision. The frozen weights are dequantized on the fly for each matrix multiplication, while the small adapters are trained in higher precision. It cuts the memory needed for the base model by roughly a factor of four compared with sixteen-bit weights.",
    "activation checkpointing": "Activation checkpointing saves memory by not keeping every intermediate result of the forward pass. During the backward pass the missing activations are recomputed from a few saved checkpoints. A model usually trains about a third slower with it, but it can fit much longer sequences or larger batches.",
    "mixed precision": "Mixed precision training runs most matrix multiplications in a sixteen-bit format such as bfloat16 while keeping sensitive quantities in thirty-two bits. Modern accelerators execute sixteen-bit math several times faster than thirty-two-bit math. Bfloat16 keeps the exponent range of thirty-two-bit floats, so it rarely needs loss scaling.",
    "sequence packing": "Sequence packing joins several short training examples into one sequence of the maximum length. Without packing, short examples are padded, and the padding costs compute without teaching the model anything. Packing keeps every position useful, which raises the number of real tokens processed per second.",
    "padding": "Padding fills shorter sequences in a batch up to the length of the longest one, so that the batch forms a rectangle. The padded positions are masked out of attention and of the loss. They still cost memory and usually compute, so a benchmark that counts padded positions as tokens overstates throughput.",
    "model FLOPs utilization": "Model FLOPs utilization compares the floating point operations a training step needs in theory with what the hardware could deliver at its peak. A value of forty percent means the job used forty percent of the accelerator's peak rate on useful model math. Recomputed activations do not count as useful work in this measure.",
    "a warm-up period in benchmarks": "The first steps of a training run are slower than the rest. Kernels are compiled or selected, memory pools grow, and caches fill. A fair throughput figure leaves these warm-up steps out and measures the steady state that a long run would see.",
    "the coefficient of variation": "The coefficient of variation is the standard deviation of a set of measurements divided by their mean. For step times it shows how steady a run was. A value of one percent means the steps barely varied, while twenty percent suggests interference from other work or an unstable input pipeline.",
    "an out-of-memory error": "An out-of-memory error happens when a process asks the device for more memory than it has free. In training it usually appears during the first forward or backward pass of a configuration that is too large. A benchmark should record it as its own outcome rather than as a failure with empty numbers.",
    "tokens per second": "Tokens per second counts how many real tokens a training job processes each second. A global figure adds up all devices, while a per-device figure divides by their number. Comparing runs is only fair when both count the same thing, preferably real tokens rather than padded positions.",
    "a learning rate schedule": "A learning rate schedule changes the step size of the optimizer over the course of training. A common choice warms up linearly for a few hundred steps and then decays. Short benchmark runs often keep the schedule simple, because they measure speed and memory rather than the final quality of the model.",
    "the optimizer state": "The optimizer state holds extra numbers per trained parameter, such as the running averages of Adam. For full fine-tuning with Adam in thirty-two bits it needs eight bytes per parameter, often more than the weights themselves. Sharding it across devices or training fewer parameters with adapters shrinks it.",
    "tensor cores": "Tensor cores are units in recent GPUs that multiply small matrices in a single instruction. They deliver most of a GPU's peak floating point rate, but only for supported formats and shapes. Matrix dimensions that are multiples of eight or sixteen tend to use them best.",
    "an all-reduce": "An all-reduce combines a value from every device, for example by summing, and gives the result back to all of them. Data parallel training uses it to average gradients. Its cost depends on the size of the message and the bandwidth between devices, which is why fast interconnects matter.",
    "a process group": "A process group is the set of processes that take part in collective communication. Each process has a rank, and rank zero often does the bookkeeping, such as writing results. All members must call each collective in the same order, or the job waits forever.",
    "a tokenizer": "A tokenizer turns text into a sequence of integer ids that the model can read. Byte-level tokenizers can represent any text, because every byte has an id of its own. Merges learned from data join frequent byte pairs into single tokens, which shortens typical sequences.",
    "a causal language model": "A causal language model predicts each token from the tokens before it. During training it sees a whole sequence at once and uses a mask so that no position can look ahead. The loss is the average negative log probability of each next token.",
    "the attention mechanism": "Attention lets every position in a sequence collect information from other positions. Each position forms a query, compares it with the keys of the positions it may see, and mixes their values by the resulting weights. The cost grows with the square of the sequence length.",
    "a benchmark matrix": "A benchmark matrix crosses every option under study, such as models, batch sizes and device counts, so that each combination becomes one experiment. Running the whole matrix the same way makes the results comparable. Recording a status for every cell, including failures, keeps the table honest.",
    "a regression test for performance": "A performance regression test compares new measurements with a reference and flags changes beyond a threshold. Measurements are noisy, so a good test repeats runs and asks whether a difference is larger than the noise. Otherwise it raises false alarms and people learn to ignore it.",
    "memory fragmentation": "Memory fragmentation leaves free memory split into pieces too small for a new request. A caching allocator reduces the cost of allocation but can hold memory that the process no longer uses. Reserved memory is therefore often larger than the memory the tensors actually occupy.",
    "a sidecar process": "A sidecar process runs next to a job and observes it without being part of it. In benchmarks it can sample memory use at a fixed interval. Because it lives in a separate process, a crash or a busy loop in the job does not stop it from recording.",
    "reproducible experiments": "An experiment is reproducible when the same inputs give the same outputs. That needs fixed random seeds, pinned software versions and a record of the hardware. Even then, parallel floating point sums can differ in the last bits from run to run.",
    "a cost per million tokens": "The cost per million tokens divides what a run costs by the number of tokens it processed, scaled to a million. It combines the price of the hardware with the speed of the job. A faster configuration on an expensive machine can still be the cheaper one.",
    "the loss curve": "The loss curve plots the training loss against the step number. Early in training it falls quickly, then more slowly. In a short benchmark run it mainly serves as a check that the job is learning something and that nothing went badly wrong, such as a loss that turns into not-a-number.",
}

PROCEDURES = {
    "prepare a benchmark run": [
        "Write down the options you want to compare.",
        "Choose a fixed number of steps and a warm-up to leave out.",
        "Preview the matrix before spending machine time.",
        "Run every cell the same way and keep the logs.",
        "Compare the results with a reference run.",
    ],
    "resume an interrupted matrix": [
        "Keep the results folder of the first attempt.",
        "Start the same command again with resume turned on.",
        "Let finished experiments be skipped by their ids.",
        "Check that the summary lists every experiment once.",
    ],
    "read a summary table": [
        "Find the status column first.",
        "Look at throughput only for cells that finished.",
        "Compare peak memory with the capacity of the device.",
        "Check the variation of step times before trusting small differences.",
    ],
    "brew a pot of tea": [
        "Boil fresh water.",
        "Warm the pot with a little hot water and pour it out.",
        "Add one spoon of leaves per cup.",
        "Pour the water over the leaves and wait three to five minutes.",
        "Strain the tea into cups.",
    ],
    "plant a tomato seedling": [
        "Pick a sunny spot.",
        "Dig a hole deeper than the pot.",
        "Set the seedling in so that part of the stem is buried.",
        "Fill the hole and press the soil gently.",
        "Water it well and add a stake for support.",
    ],
    "clean a bicycle chain": [
        "Shift to the smallest rear cog.",
        "Wipe the chain with a dry cloth while turning the pedals backwards.",
        "Apply a degreaser and scrub the links.",
        "Rinse and dry the chain.",
        "Add one drop of oil to each link and wipe off the excess.",
    ],
    "write a short report": [
        "State the question in one sentence.",
        "Describe how you answered it.",
        "Give the main numbers with their units.",
        "Say what you did not check.",
        "End with a recommendation.",
    ],
    "choose a batch size": [
        "Start with the largest per-device batch that fits in memory.",
        "Use gradient accumulation to reach the effective batch size you need.",
        "Measure throughput for a few sizes.",
        "Keep the size that gives the best speed without hurting the loss.",
    ],
    "fold a paper boat": [
        "Fold a rectangular sheet in half from top to bottom.",
        "Fold the top corners down to the middle.",
        "Fold the bottom strips up on both sides.",
        "Open the shape into a square and fold it into a triangle.",
        "Pull the sides apart to open the boat.",
    ],
    "set up a small garden bed": [
        "Mark out the bed with string.",
        "Remove grass and stones.",
        "Loosen the soil to a spade's depth.",
        "Mix in compost.",
        "Rake the surface level before sowing.",
    ],
    "check a tire's pressure": [
        "Find the recommended pressure on the tire or in the manual.",
        "Remove the valve cap.",
        "Press the gauge firmly onto the valve.",
        "Read the value and add or release air.",
        "Put the cap back.",
    ],
    "debug a slow training job": [
        "Check whether the device is busy with a profiler.",
        "Look for time spent loading data.",
        "Compare the step time with a known good run.",
        "Try a larger batch to see whether the job is bound by overhead.",
        "Change one thing at a time.",
    ],
    "bake simple bread": [
        "Mix flour, water, salt and yeast.",
        "Knead the dough until it is smooth.",
        "Let it rise until it doubles.",
        "Shape the loaf and let it rise again.",
        "Bake it in a hot oven until the crust is brown.",
    ],
    "compare two benchmark runs": [
        "Match experiments by their settings.",
        "Compute the ratio of each metric.",
        "Check whether the difference is larger than the run-to-run noise.",
        "List the experiments that appear in only one run.",
    ],
}

WORDS = [
    "matrix",
    "gradient",
    "tensor",
    "shard",
    "kernel",
    "adapter",
    "token",
    "memory",
    "device",
    "cluster",
    "schedule",
    "optimizer",
    "parameter",
    "sequence",
    "benchmark",
    "throughput",
    "latency",
    "checkpoint",
    "precision",
    "accelerator",
    "garden",
    "window",
    "river",
    "mountain",
    "lantern",
    "bicycle",
    "harbor",
    "meadow",
    "pencil",
    "teapot",
]
UNITS = [
    ("kilometres", "metres", 1000),
    ("metres", "centimetres", 100),
    ("kilograms", "grams", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("litres", "millilitres", 1000),
    ("gibibytes", "mebibytes", 1024),
]


def _record(instruction: str, output: str, given: str = "") -> dict[str, str]:
    return {"instruction": instruction, "input": given, "output": output}


def records(rng: random.Random) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for topic, text in EXPLANATIONS.items():
        out.append(_record(f"Explain {topic} in a few sentences.", text))
        first = text.split(". ")[0].rstrip(".") + "."
        out.append(_record("Summarize the following paragraph in one sentence.", first, text))
        count = f"It has {text.count('. ') + 1} sentences."
        out.append(_record("How many sentences does this paragraph have?", count, text))
    for task, steps in PROCEDURES.items():
        numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
        out.append(_record(f"List the steps to {task}.", numbered))
        out.append(_record(f"What is the first step to {task}?", steps[0]))
    for _ in range(60):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        op = rng.choice(["add", "subtract", "multiply"])
        if op == "add":
            out.append(_record(f"Add {a} and {b}.", f"{a} + {b} = {a + b}."))
        elif op == "subtract":
            out.append(_record(f"Subtract {b} from {a}.", f"{a} - {b} = {a - b}."))
        else:
            out.append(_record(f"Multiply {a} by {b}.", f"{a} × {b} = {a * b}."))
    for _ in range(45):
        big, small, factor = rng.choice(UNITS)
        n = rng.randint(1, 250)
        out.append(_record(f"Convert {n} {big} to {small}.", f"{n} {big} is {n * factor} {small}."))
    for _ in range(45):
        nums = [rng.randint(0, 500) for _ in range(rng.randint(3, 12))]
        order = rng.choice(["ascending", "descending"])
        ordered = sorted(nums, reverse=order == "descending")
        out.append(
            _record(
                f"Sort these numbers in {order} order.",
                ", ".join(map(str, ordered)),
                ", ".join(map(str, nums)),
            )
        )
    for word in WORDS:
        out.append(_record("Spell the word backwards.", word[::-1], word))
        vowels = sum(c in "aeiou" for c in word)
        has = f"The word '{word}' has {vowels} vowel{'s' if vowels != 1 else ''}."
        out.append(_record("How many vowels are in this word?", has, word))
        out.append(_record("Write the word in capital letters.", word.upper(), word))
    for _ in range(40):
        picked = rng.sample(WORDS, rng.randint(3, 8))
        alphabetical = " ".join(sorted(picked))
        out.append(
            _record("Put these words in alphabetical order.", alphabetical, " ".join(picked))
        )
    rng.shuffle(out)
    return out


def main() -> None:
    data = records(random.Random(20261122))
    with OUT.open("w", encoding="utf-8") as f:
        for record in data:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {len(data)} records to {OUT}")


if __name__ == "__main__":
    main()
