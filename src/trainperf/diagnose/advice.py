"""What each finding tells the user to do: the fix of every kind (RECOMMENDATIONS) and the variants a rule
chooses from its evidence (the loop's kind, the collective's, the fault's cause), as text templates.

Kept apart from the findings' records and their pricing (findings.py): the rules and rules._adapted pick a text here
and fill it in; nothing here computes a figure."""

# exposed_comm when most of it is collectives of a handful of values (collectives.scalar_collective_rows)
EXPOSED_SCALAR_RECOMMENDATION = (
    "Most of the communication time is collectives of a handful of values: barriers (dist.barrier() is an all-reduce "
    "of one element), a loss or metric averaged across ranks, a gradient norm. No bandwidth or overlap setting "
    "shortens them: their time is each rank waiting for the slowest one, and the host waits with them. Take "
    "dist.barrier() out of the training loop, reduce metrics every N steps or with async_op=True and read them later, "
    "and look at why ranks arrive at different times (the straggler or load-imbalance findings).")

# exposed_comm when most of it is point-to-point (send/recv): a pipeline stage waiting for its neighbours (the
# bubble of the schedule and unequal stages) or context parallelism's ring exchange, which bucketing and
# prefetch (the collectives' fixes) do not touch
EXPOSED_P2P_RECOMMENDATION = (
    "Most of the exposed communication is point-to-point (send/recv). Between pipeline stages it is the "
    "schedule's bubble and unequal stages: more micro-batches per step than stages, an interleaved schedule "
    "(virtual pipeline stages), layers balanced across stages, and send/recv overlapped with compute "
    "(Megatron overlap_p2p_comm); in context-parallel ring attention, overlap each block's key/value exchange "
    "with the attention of the block before.")

# idle_gpu, before its fix: where the idle lies, in gaps of rules.LONG_IDLE_GAP_US or more (the host away from
# launching) or in the short gaps between kernels (its launching behind the GPU)
IDLE_LONG_GAPS = ("Most of the GPU's idle time is {n} of 1 ms or more{where} ({share:.0f} % of the idle): the "
                  "GPU waits while the host does something other than launching, once or a few times a step: a data "
                  "fetch, a read that synchronises, logging, a checkpoint. ")
IDLE_SHORT_GAPS = ("Most of the GPU's idle time is short gaps between kernels ({share:.0f} % of the idle in gaps under "
                   "1 ms): the host launches slower than the GPU runs them: fewer, larger kernels (torch.compile), "
                   "CUDA graphs, a larger batch. ")

# pipeline_bubble with the job's stages known (the pipeline's described group, or pipeline.stages_from_openings): what
# the schedule's law gives, before the kind's fix; with the micro-batches the schedule names (BUBBLE_LAW) or, without
# them, the micro-batches the measured share would take (BUBBLE_IMPLIED)
BUBBLE_LAW = ("With {p} stages and {m} micro-batches a step{chunks}, a balanced schedule idles {law:.1f} % of the "
              "step; this stage waited {share:.1f} %: what is above the law is unequal stages or transfers. ")
BUBBLE_CHUNKS = " in {v} model chunks per rank (interleaved)"
BUBBLE_IMPLIED = ("With {p} stages, a balanced schedule idles the {share:.1f} % of the step this stage waited with "
                  "{m:.1f} micro-batches a step: aim for at least {p4} (4 per stage). ")

# exposed_comm when most of it is point-to-point in a process group the trace describes as context parallelism's
# (pipeline.p2p_group_role): ring attention's key/value exchange, not a pipeline's
EXPOSED_RING_RECOMMENDATION = (
    "Most of the exposed communication is point-to-point in the context-parallel group: ring attention's key/value "
    "exchange between the ranks holding the sequence's chunks. Overlap each block's exchange with the attention of "
    "the block before (Transformer Engine's cp_comm_type='p2p' does, given enough work per block: longer chunks, or "
    "'a2a+p2p' / hierarchical context parallelism to keep the ring inside a node), keep the context-parallel group "
    "within NVLink where it fits, and use fewer context-parallel ranks where the sequence fits in memory (Ulysses-style "
    "all-to-all, cp_comm_type='a2a', needs heads divisible by the group).")

# exposed_comm when most of it is all-to-all: expert parallelism's token dispatch and combine (MoE) or sharded
# embeddings' feature exchange (TorchRec). The computation right after consumes what it brings, so bucketing does
# not hide it: overlapping needs another micro-batch's work beside it, and its size follows the routing
EXPOSED_ALL_TO_ALL_RECOMMENDATION = (
    "Most of the exposed communication is all-to-all: expert parallelism's dispatch and combine (MoE) or sharded "
    "embeddings' exchange. The experts need the tokens it brings, so overlap it with another micro-batch's "
    "computation (two micro-batches interleaved, as DeepSeek's DualPipe and two-batch overlap; DeepEP's hook-based "
    "receive; TorchRec's pipelined sparse stage); send less (routing limited to few nodes, FP8 dispatch) and keep "
    "it inside a node where the expert-parallel group fits; balance tokens across experts (auxiliary loss, "
    "capacity factor) so that no rank waits for the busiest.")
# ... where this rank sends one rank of the group >= SPLIT_SKEW_MIN times its mean share (routing.send_split_skew):
# the experts (or the embedding shards) there are hot, and the all-to-all waits for them; put before the above
HOT_RANK_PREFIX = {
    "experts": "This rank sends {ratio:.1f}x its mean share of its all-to-all data to rank {peer} (of {peers}): the "
               "experts there draw more tokens, and the all-to-all waits for that rank. Balance the routing first (a "
               "load-balancing loss or aux-loss-free bias, a capacity factor, replicated hot experts: EPLB). ",
    "embeddings": "This rank sends {ratio:.1f}x its mean share of its all-to-all data to rank {peer} (of {peers}): "
                  "the embedding shards there serve more lookups, and the all-to-all waits for that rank. Balance the "
                  "sharding plan by cost first (lookups and pooling, not rows: TorchRec's planner, row- or column-wise "
                  "sharding of the hot tables). "}

# data_loader_stall by the loader's iterator (rules.data_loader_stall): no workers, or workers that do not keep up;
# allocator_stall by where the driver frees are made (diagnose/allocator.py); optimizer_slow on foreach kernels
SINGLE_PROCESS_LOADER_RECOMMENDATION = (
    "The DataLoader has no worker processes (num_workers=0: its iterator is _SingleProcessDataLoaderIter), so each "
    "batch is read, decoded and collated on the training thread while the GPU waits: give it workers "
    "(DataLoader(..., num_workers=4 or more, persistent_workers=True, pin_memory=True)) so that batches are made "
    "ahead; if a sample is still slow to make, decode or augment on the GPU or preprocess offline.")
WORKER_LOADER_RECOMMENDATION = (
    "The DataLoader's worker processes do not keep up (its iterator is _MultiProcessingDataLoaderIter and the loop "
    "still waits for batches): raise num_workers (up to the CPU cores a GPU has) and prefetch_factor, set "
    "persistent_workers=True and pin_memory=True, make each sample cheaper (decode or augment on the GPU, preprocess "
    "offline), and check the storage's read rate.")
ALLOCATOR_OFF_RECOMMENDATION = (
    "Every tensor freed reaches the driver ({stretches:.0f} separate stretches of cudaFree/hipFree a step, where "
    "tensors die inside operators, autograd nodes and Python): the caching allocator is off, and each cudaFree/hipFree "
    "synchronises the device. Unset PYTORCH_NO_CUDA_MEMORY_CACHING / PYTORCH_NO_HIP_MEMORY_CACHING (a debugging "
    "setting, e.g. for compute-sanitizer); to fight fragmentation keep the allocator and set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
CACHE_EMPTIED_RECOMMENDATION = (
    "The allocator's cache is handed back to the driver every step ({frees:.0f} cudaFree/hipFree calls a step outside "
    "any operator, in {stretches:.0f} stretch(es) a step) and the next step's operators allocate it all again through "
    "cudaMalloc/hipMalloc: torch.cuda.empty_cache() (or code calling it: a memory-logging callback, an out-of-memory "
    "guard) runs inside the training loop. Remove it, or call it only where memory must go back to the device "
    "(between training and evaluation); for fragmentation set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "instead.")
# launch_bound's last word, whichever fix it names
LAUNCH_BOUND_PROFILER_CHECK = ("The profiler slows the host too: first check that the step time measured without it "
                               "exceeds the GPU's busy time per step (gpu_busy_per_step); if not, the loop is "
                               "GPU-bound.")
# launch_bound where the trace shows CUDA graph replays already, or torch.compile's regions without them
PARTLY_GRAPHED_RECOMMENDATION = (
    "Part of the step already replays as CUDA graphs ({graphed:.0f} kernels a step) and the GPU still waits for the "
    "CPU to launch the rest one by one ({launches:.0f} launches a step): capture those too (the ops around the "
    "longest launch-bound stretches named above: often the optimizer step, the loss, or code a graph break left out "
    "of the captured region), or fuse them (torch.compile). " + LAUNCH_BOUND_PROFILER_CHECK)
COMPILED_WITHOUT_GRAPHS_RECOMMENDATION = (
    "The step runs torch.compile's code, yet the GPU waits for the CPU to launch its {launches:.0f} kernels a step one "
    "by one: compiled in the default mode, the kernels are not captured as CUDA graphs. Compile with "
    "mode='reduce-overhead' (CUDA graphs; static shapes, no CPU work or sync inside the region), or raise the per-GPU "
    "batch size so each kernel does more work. " + LAUNCH_BOUND_PROFILER_CHECK)
# what a job at the edge of its device's memory does about it (memory pressure, however it was read)
LOWER_THE_PEAK = ("Lower the peak (activation checkpointing, a smaller micro batch, sharding the model and optimizer "
                  "state: FSDP/ZeRO), set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, and "
                  "watch torch.cuda.memory_stats()['num_alloc_retries'].")
MEMORY_PRESSURE_RECOMMENDATION = (
    "The allocator runs out of device memory and hands its cache back to retry ({pct:.0f} % of the cudaFree/hipFree "
    "calls are made inside an operator just before it allocates again: the caching allocator's retry after a failed "
    "cudaMalloc), and each cudaFree/hipFree synchronises the device: the job runs at the edge of the device's memory. "
    + LOWER_THE_PEAK)
# the allocator reached inside the step with no retry pattern, while its samples (profile_memory=True) put the
# reserved peak at the device's edge (memory.DeviceMemory.near_full)
NEAR_FULL_RECOMMENDATION = (
    "The allocator reaches the driver inside the step while its reserved memory is at the device's edge ({memory}): "
    "the cache cannot grow, so blocks are handed back and allocated again, and each cudaFree/hipFree synchronises the "
    "device. " + LOWER_THE_PEAK)
# NEAR_FULL_RECOMMENDATION of a forward-only loop: a serving engine fills the device on purpose (its KV cache), so
# what is squeezed is the memory left for the step's activations and workspaces
INFERENCE_NEAR_FULL_RECOMMENDATION = (
    "The allocator reaches the driver inside the forward-only step while its reserved memory is at the device's edge "
    "({memory}): a serving engine's KV cache takes most of the device by design (vLLM's gpu_memory_utilization, "
    "SGLang's mem_fraction_static), and what it leaves is too little for the step's activations and workspaces, so "
    "blocks are handed back and allocated again, each cudaFree/hipFree synchronising the device. Leave the step more: "
    "a lower memory fraction for the cache, fewer tokens a batch (max_num_batched_tokens, chunked prefill), or CUDA "
    "graphs, whose private memory pool is allocated once.")
FOREACH_OPTIMIZER_RECOMMENDATION = (
    "The optimizer already runs foreach (multi_tensor_apply kernels), and its update is still several passes over "
    "the parameters and their states a step (AdamW's: ~7 kernels, each reading and writing them): switch to the "
    "fused implementation, one pass (torch.optim.AdamW(..., fused=True); Adam, SGD and Adagrad have it too), or "
    "compile the optimizer step (torch.compile of opt.step); or shard the optimizer state (ZeRO/FSDP) so each rank "
    "updates its share.")
# optimizer_slow when the optimizer's spans launch no kernel while the GPU idles through them (host_bound.host_work's
# host work inside them, rules._optimizer_slow's host-bound phase): the update runs on the CPU, its states offloaded
HOST_OPTIMIZER_RECOMMENDATION = (
    "The optimizer step runs on the CPU (it launches no GPU kernel: its states are offloaded to host memory, as "
    "DeepSpeed ZeRO-Offload's DeepSpeedCPUAdam or FSDP's CPU offload keep them) and the GPU idles through it. Where "
    "the states fit on the GPUs, keep them there (no offload, or sharded over more ranks: ZeRO-2/3, FSDP); else "
    "offload only part of them (DeepSpeed's offload ratio), overlap the CPU step with the GPU's next work (DeepSpeed's "
    "ZenFlow, overlap_comm), use the vectorised CPU Adam (DeepSpeedCPUAdam rather than torch's CPU AdamW) with a core "
    "per thread, and accumulate more micro-batches per step so that the step is paid less often.")
# gc_stall when most of the collections' time is inside gc.collect() calls of the program (rules.GC_CALLED_MIN_SHARE):
# the collector runs because the code asks it to, a full collection each call
GC_CALLED_RECOMMENDATION = (
    "The program calls gc.collect() itself ({calls} calls in {steps} steps, most at {site}), and each call without "
    "an argument is a full collection, which walks every live Python object (a process that imported torch holds "
    "hundreds of thousands): it costs that on every call, freed memory or not. Call it rarely (every few hundred "
    "steps, at the same step on every rank, or only before a checkpoint or an evaluation) or not at all: tensors are "
    "freed by reference counting, and the collector only finds cycles. A torch.cuda.empty_cache() beside it returns "
    "the cached blocks to the driver, which then allocates them again (allocator_stall): drop it too. To bound the "
    "collector's pauses in a long run, gc.freeze() after start-up and a gc.collect(1) every N steps (torchtitan's "
    "training.gc_freq, trainperf train --gc-every N).")
# optimizer_slow when the step span names an optimizer that preconditions with per-layer matrices
# (rules.PRECONDITIONED_OPTIMIZER_RE): its cost is the preconditioners' matrix work, which fused elementwise kernels
# (the default fix) do not touch
PRECONDITIONED_OPTIMIZER_RECOMMENDATION = (
    "The optimizer preconditions each layer's gradient with matrices (Shampoo and SOAP: roots or eigenvectors of "
    "second-moment statistics; K-FAC: factor inverses; Muon: Newton-Schulz orthogonalisation), and that matrix work "
    "is the step's cost, not elementwise kernels. Compute the preconditioners less often (Distributed Shampoo's and "
    "SOAP's precondition_frequency, K-FAC's inverse update interval), split their computation across the "
    "data-parallel ranks instead of repeating it on each (Distributed Shampoo's distributed_config, a distributed "
    "Muon that orthogonalises a share of the matrices per rank and all-gathers the results), keep the host out of "
    "the loop over layers (batched matrix ops, torch.compile), and start preconditioning after a warm-up.")

# exposed_comm when one process drives several GPUs side by side and most of its communication is broadcast and
# reduce (rules.exposed_comm): nn.DataParallel, which broadcasts the parameters to every replica before each forward
# and reduces the gradients onto GPU 0 once the whole backward is done, every step
EXPOSED_DATA_PARALLEL_RECOMMENDATION = (
    "One process drives the GPUs and most of the exposed communication is broadcast and reduce: nn.DataParallel, "
    "which copies the parameters to every GPU before each forward, gathers the outputs and reduces the gradients "
    "onto GPU 0 after the whole backward (nothing overlaps them), runs the optimizer on GPU 0 alone and drives the "
    "replicas from threads sharing one interpreter lock. Replace it with DistributedDataParallel, one process per GPU "
    "(torchrun --nproc-per-node N): no per-step copy of the parameters, the gradients all-reduced in buckets during "
    "the backward. Hugging Face Trainer falls back to DataParallel when a script sees several GPUs without being "
    "launched by torchrun or accelerate launch.")

# the host-bound kinds' fix when one PyTorch process drives several GPUs side by side (rules.run_rules): every GPU
# waits on one host whose threads share one interpreter lock, so the first fix is a host per GPU
ONE_HOST_FOR_SEVERAL_GPUS = (
    "One process launches the work of all its GPUs (nn.DataParallel's replicas, or threads of one script), its "
    "threads taking turns on one interpreter lock: run one process per GPU first (DistributedDataParallel under "
    "torchrun), which gives each GPU a host of its own; then, if the GPU still waits for its host:")

# exposed_comm when most of it is all-reduce issued in the forward pass (facts.forward_all_reduce_us): tensor
# parallelism's, whose next layer consumes the reduced activations at once, so DDP's bucketing does not apply
EXPOSED_TP_RECOMMENDATION = (
    "Most of the exposed communication is all-reduce issued in the forward pass: tensor parallelism's, which the "
    "next layer needs at once. Keep the tensor-parallel group inside one NVLink/xGMI domain (degree at most the "
    "GPUs per node) or lower its degree (more data or pipeline parallelism instead); with sequence parallelism the "
    "same bytes move as reduce-scatter and all-gather next to the GEMMs, which asynchronous tensor parallelism "
    "overlaps with them (torchtitan/PyTorch async TP, Transformer Engine's userbuffers comm-GEMM overlap); in "
    "inference, a one-shot custom all-reduce (vLLM/SGLang) or one fused with the next RMSNorm (FlashInfer).")

# exposed_comm when most of it is all-gather and reduce-scatter: sharded data parallelism's (FSDP, ZeRO-3: each unit's
# parameters gathered before its forward and backward, its gradients reduce-scattered after) or sequence
# parallelism's; DDP's gradient bucketing does not apply, the units' prefetch and size do
# comm_contention's fix led by the collective most of the slowed computation ran beside (a majority)
CONTENTION_BESIDE = {
    "all_reduce": "Most of it runs beside all-reduces (data parallelism's gradient buckets, or tensor parallelism's "
                  "activations). ",
    "all_gather": "Most of it runs beside all-gathers (sharded data parallelism's parameter gathers, FSDP's or "
                  "ZeRO-3's). ",
    "reduce_scatter": "Most of it runs beside reduce-scatters (sharded data parallelism's gradient reduction). ",
    "all_to_all": "Most of it runs beside all-to-all (expert parallelism's dispatch and combine: DeepEP's SMs, "
                  "Buffer.set_num_sms, are the knob to turn first). ",
    "send_recv": "Most of it runs beside send/recv (a pipeline's or context parallelism's transfers). ",
}

# exposed_comm where computation beside a collective is measured slower than alone (contention.measured_contention):
# hidden behind computation C, exposed time E costs C + E (1 - 1/s) instead of C + E, so hiding it gains about E / s
OVERLAP_SLOWS_COMPUTATION = (
    "On this rank, computation beside a collective already runs {slowdown:.2f}x slower than alone (its SMs and memory "
    "shared with the collective's kernels): the computation these collectives would hide behind slows as much, so "
    "hiding them gains about 1/{slowdown:.2f} of their exposed time, less than the gain priced.")

EXPOSED_SHARDED_RECOMMENDATION = (
    "Most of the exposed communication is all-gather and reduce-scatter: sharded data parallelism's (FSDP, ZeRO, "
    "Megatron's distributed optimizer) or sequence parallelism's. Gather the next unit's parameters while this one "
    "computes (FSDP2 set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; FSDP1 forward_prefetch=True, "
    "backward_prefetch=BACKWARD_PRE; DeepSpeed overlap_comm and stage3_prefetch_bucket_size; Megatron "
    "--overlap-grad-reduce --overlap-param-gather), wrap fewer, larger "
    "units, keep the last units unsharded after the forward (reshard_after_forward=False) where memory allows, and "
    "shard within a node only when the links between nodes are the limit (HSDP: replicate across nodes, ZeRO++ "
    "hpZ); with sequence parallelism, overlap them with the GEMMs beside them (async tensor parallelism).")

# exposed_comm when the collectives move their data far below the link's rate for their sizes
# (rules.SLOW_TRANSFER_SHARE, collectives.transfer_rate): the transport is slow, whatever is hidden; put before the
# kind's other fix
EXPOSED_SLOW_TRANSFER_RECOMMENDATION = (
    "The collectives move their data at {pct:.0f} % of the {link} link's rate for their sizes ({busbw:.1f} GB/s bus "
    "bandwidth against {link_gbps:.0f} GB/s): the transfer itself is slow, not only unhidden. Check the transport "
    "NCCL chose (NCCL_DEBUG=INFO: NET/Socket instead of NET/IB, or no GPUDirect RDMA, between nodes; SHM or P2P "
    "disabled instead of NVLink within one), a forced protocol or algorithm (NCCL_PROTO, NCCL_ALGO), the NICs per "
    "GPU and their PCIe placement; nccl-tests' all_reduce_perf on the same GPUs gives the rate to expect.{ll}{alone}")
# ... when most of their bytes went over NCCL's LL protocol (collectives.LL_PROTOCOL_RE)
SLOW_TRANSFER_LL = (" {pct:.0f} % of the bytes went over NCCL's LL protocol, made for small messages (half a link's "
                    "rate at most): a forced NCCL_PROTO, or a tuner that sees a slow link.")
# ... read from one rank's trace: its partners' arrivals are not seen
SLOW_TRANSFER_ONE_RANK = (" (Read from this rank's trace alone, the fastest of each collective's repeats: a partner "
                          "that arrives late every time reads the same; diagnose every rank's trace together to tell "
                          "the two apart.)")

# host_sync when much of the host's blocking is on its own host-to-device copies (rules.HOST_TO_DEVICE_SYNC_SHARE): the
# input copied with non_blocking=False, whose fix is not dropping a read but copying asynchronously, ahead of time; put
# before the kind's other fix (the default, or a forward-only loop's)
HOST_TO_DEVICE_SYNC_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is on its own host-to-device copies: tensor.to(device) with non_blocking=False "
    "copies, then synchronizes the stream, which also waits for all the work queued before the copy. Copy from pinned "
    "memory (DataLoader(pin_memory=True)) with .to(device, non_blocking=True), and prefetch the next batch on a side "
    "stream (a CUDA stream and an event per batch) so that the copy overlaps the step before. For the other syncs:")

# host_sync by what made most of the blocking (rules.host_sync, diagnose/sync_causes.py): operators whose output size
# depends on the data; value reads followed by an all-to-all (its split sizes: dropless MoE's token counts per expert);
# synchronize calls inside no operator, FSDP1's rate limiter among them
SHAPE_SYNC_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is in operators whose output size depends on the data ({ops}): each waits for "
    "the GPU to finish before the host can size its output. Keep shapes static: torch.where, or multiplying by the "
    "mask, instead of boolean-mask indexing and masked_select; nonzero_static(size=...) or a fixed capacity instead of "
    "nonzero; repeat_interleave(..., output_size=n) and bincount(..., minlength=n) with the sizes known ahead; unique "
    "on the host once, outside the loop.")
SPLIT_SIZES_SYNC_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is in values read back right before an all-to-all: its split sizes, which the "
    "host needs to size the exchange (an expert-parallel layer's token counts per expert in a dropless MoE, sharded "
    "embeddings' feature lengths). Avoid the read or take it off the critical path: a fixed capacity per expert, "
    "whose all-to-all has fixed sizes (tokens beyond it dropped or padded: Megatron's --moe-expert-capacity-factor "
    "with --moe-pad-expert-input-to-capacity); a dispatcher whose buffers are sized for the worst case, so that the "
    "counts stay on the GPU (DeepEP's low-latency kernels); for sharded embeddings the next batch's input "
    "distribution started during this batch's compute (TorchRec's TrainPipelineSparseDist); at least exchange the "
    "sizes for the next layer while this one computes.")
RATE_LIMITER_SYNC_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is in FSDP's rate limiter (FullyShardedDataParallel.rate_limiter, "
    "limit_all_gathers=True): the host waits for an earlier layer's unsharded parameters to be freed before it "
    "all-gathers the next, which caps memory but stalls the launches. With memory to spare, limit_all_gathers=False; "
    "or FSDP2 (fully_shard), which orders the all-gathers with stream waits on the device and never blocks the host.")
BARE_SYNC_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is in synchronize calls made in no operator ({calls}): "
    "torch.cuda.synchronize() or a stream or event synchronize in the loop, waiting for nothing the host "
    "uses (timing code, ordering between streams). Drop them: time with CUDA events read after the step "
    "(torch.cuda.Event(enable_timing=True)), and order streams on the device (stream.wait_stream, wait_event) instead "
    "of on the host.")

# host_sync when most of the host's blocking is in kernel launches that each waited for their own kernel
# (replay.synchronous_launches)
SYNCHRONOUS_LAUNCH_RECOMMENDATION = (
    "{pct:.0f} % of the host's blocking is in kernel launches ({calls}) that each return only after their own kernel "
    "has run: launches are synchronous. {setting} Then the host queues work ahead of the device; profile again: every "
    "other host-bound figure of this trace is inflated by it.")
# the setting that makes them so, by the runtime the launch calls belong to (their names' prefix)
SYNCHRONOUS_LAUNCH_SETTINGS = {
    "cu": "CUDA_LAUNCH_BLOCKING=1 makes them so, a debugging setting: unset it in the job's environment (the "
          "launcher, the container, a shell profile).",
    "hip": "HIP_LAUNCH_BLOCKING=1 or AMD_SERIALIZE_KERNEL=3 makes them so, debugging settings: unset them in the job's "
           "environment (the launcher, the container, a shell profile).",
    "": "This device's runtime submits each job and waits for it: look for its synchronous or debugging mode (on "
        "NVIDIA CUDA_LAUNCH_BLOCKING=1, on ROCm HIP_LAUNCH_BLOCKING=1), or for an asynchronous submission path.",
}

# straggler when the ranks exchange mostly point-to-point (pipeline stages): a stage that computes longer than
# the others is an unequal split of the layers, not a faulty machine; every other stage idles for it each micro-batch
STRAGGLER_STAGE_RECOMMENDATION = (
    "The slow rank is a pipeline stage (its communication is mostly send/recv, or its schedule names its actions): "
    "the stages hold unequal work. "
    "Move layers off it (the first stage also runs the embedding, the last the output layer and the loss: Megatron's "
    "account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split, or an uneven layer split), "
    "or use an interleaved schedule; if the stages are equal by construction, check its GPU and host (thermal "
    "throttling, a slower link).")

# host_work whose cost falls in one analysed step (host_bound.host_work, ONE_OFF_SHARE): periodic work, every N steps
ONE_OFF_HOST_WORK_RECOMMENDATION = (
    "The host work falls in one of the {n} analysed steps: work done every N steps on the training thread while "
    "the GPU idles, most often a synchronous checkpoint save (without with_stack=True the trace names no op for "
    "it: the file write records none), else an evaluation or a metrics flush. Make it asynchronous "
    "(torch.distributed.checkpoint.async_save, a background thread) or less frequent; profile with "
    "with_stack=True to name it. Its cost per step is its time over the steps between two of them.")

# small_kernels where the GPU never waits for their launches (host_bound.small_kernels): their cost is on the device
DEVICE_PACED_SMALL_KERNELS_RECOMMENDATION = (
    "The GPU sets the pace and never waits for these tiny kernels' launches, yet each costs the device its start-up, "
    "its tail and the gap before it. Fuse them into their neighbours (torch.compile; fused norm, activation, RoPE and "
    "loss kernels: trainperf.kernels.apply(model); a fused or foreach optimizer). A CUDA graph alone would not help: "
    "it takes the launches off the host, not the kernels off the device.")

# launch_bound where the host's launch calls are themselves slow (host_bound.SLOW_LAUNCH_CALL_US)
SLOW_LAUNCH_CALLS_RECOMMENDATION = (
    "Each kernel launch call takes {us:.0f} us on the host where 5-20 us is usual: the launch path itself is slow. "
    "Find what slows it first: a contended or throttled CPU (other processes or threads on the launching core, "
    "power saving: pin the process to its own cores), a tracing or debug layer (CUDA_LAUNCH_BLOCKING, "
    "compute-sanitizer, an API interposer), an old driver or runtime. Beyond that:")

UNNAMED_CHECKPOINT_RECOMMENDATION = (
    "A synchronous checkpoint save, by what the trace shows of it: host work that launches nothing in one of the {n} "
    "analysed steps, after {copies} device-to-host copies ({mib:.0f} MiB) in that step, as a save copies the model's "
    "state to the host before it writes it (the write records no op; with_stack=True would name the save). Save "
    "asynchronously (torch.distributed.checkpoint.async_save, or a background thread writing a copy staged in pinned "
    "memory) or less often; an evaluation copying its outputs to the host looks the same: check what that step ran. "
    "Its cost per step is its time over the steps between two saves.")

# how a user names the host work a trace holds no op for, by the profiler that wrote it: PyTorch's profiler records
# the Python frames with with_stack=True; Nsight Systems records no Python frame by default, but any NVTX range (and
# samples Python with --python-sampling)
NAMING_ADVICE = {"nsys": "an NVTX range around the suspect code (torch.cuda.nvtx.range) or nsys profile "
                         "--python-sampling=true"}
DEFAULT_NAMING_ADVICE = "with_stack=True"

# the fix of a kind in a forward-only loop (facts.loop_kind "inference": generation, serving), where a training loop's
# (log every N steps, fused optimizers, DataLoader workers) does not apply; rules.run_rules puts it in place of the
# kind's default (a rule's own, more specific fix stays)
INFERENCE_RECOMMENDATIONS = {
    "gc_stall": "A forward-only loop (generation or serving) pauses for Python's garbage collector inside its steps "
                "(a full collection scans every live Python object: requests' state, a large module tree). Call "
                "gc.freeze() once the model, the engine and its CUDA graphs are built, so that the objects of the "
                "start-up leave the collector's scans, and raise the collector's thresholds (gc.set_threshold) or "
                "collect between batches, where no step waits for it.",
    "host_sync": "A forward-only loop (no backward pass, no optimizer step: generation or serving) reads results "
                 "back every step, which drains the GPU queue: the GPU idles while the host prepares the next step. "
                 "Overlap the host's scheduling and input preparation for step N+1 with the GPU's step N (vLLM's "
                 "async scheduling, SGLang's overlap scheduler), keep sampling and stop checks on the GPU as tensor "
                 "ops (no .item()/.tolist() per token), copy the tokens out with non_blocking=True into pinned "
                 "memory, and capture the step in a CUDA graph.",
    "host_work": "A forward-only loop (generation or serving) spends milliseconds at a time on host work that "
                 "launches nothing while the GPU idles (the longest gaps name the op around them): the engine's "
                 "scheduling, input preparation, sampling bookkeeping or detokenization between model steps. Overlap "
                 "it with the GPU's previous step (vLLM's async scheduling, SGLang's overlap scheduler), move "
                 "tokenization and detokenization to other processes, prepare inputs with fewer, batched tensor ops, "
                 "and gc.freeze() after start-up.",
    "launch_bound": "The GPU waits for the CPU to launch the kernels of a forward-only loop: capture the model step "
                    "in a CUDA graph (torch.compile mode='reduce-overhead'; vLLM and SGLang capture the decode "
                    "batch sizes: check that this batch size is captured), batch more requests per step "
                    "(continuous batching), or fuse kernels (torch.compile, FlashInfer).",
    "pipeline_bubble": "The stages of a forward-only pipeline (generation or serving) wait for each other: each "
                       "stage idles while the others run their part of a batch, (p - 1) / (m + p - 1) of the step "
                       "with m batches in flight. Keep at least as many batches in flight as there are stages (vLLM "
                       "schedules pipeline_parallel_size micro-batches: give it the requests, max_num_seqs, to fill "
                       "them), split large prefills into chunks, and prefer tensor "
                       "parallelism inside a node, with pipeline stages only across nodes.",
    "small_kernels": "Many kernels of this forward-only loop are tiny: capture the step in a CUDA graph "
                     "(torch.compile mode='reduce-overhead'), fuse them (torch.compile; fused norm, activation and "
                     "RoPE kernels), and batch more requests per step so that each kernel does more work.",
}

# straggler when the same rank is late every step with no more computation than the others (stragglers.straggler)
LATE_HOST_STRAGGLER_RECOMMENDATION = (
    "Rank {rank} arrives late at the collectives without computing more than the other ranks: its GPU waits for its "
    "host before the work. Look at what only that rank does on its training thread (rank-0 logging, metrics, "
    "evaluation or checkpoint bookkeeping: move it to a background thread or every N steps), at its data loading "
    "(its DataLoader workers, a slower disk) and at its CPU (fewer or shared cores, NUMA placement, other processes "
    "on the node).")

# ... and when its GPU did not idle more either: other device work (copies, communication) queued ahead of it
QUEUED_WORK_STRAGGLER_RECOMMENDATION = (
    "Rank {rank} arrives late at the collectives without computing more than the other ranks and without its GPU "
    "waiting for its host: other device work runs on it first (copies, communication or kernels outside the "
    "computation queued ahead of the collectives). Look at what only that rank's streams run before them: a "
    "rank-0 copy to the host, a collective of another process group it alone joins, offloaded state.")

# straggler when the ranks take turns being late without more work in those steps (stragglers._paused_hosts)
PAUSED_HOSTS_RECOMMENDATION = (
    "The ranks take turns arriving late at collectives without computing more in those steps: the late rank's host "
    "paused before launching its work. Most often Python's garbage collector, which runs at a different moment on "
    "each rank: gc.disable() (or gc.freeze() after start-up) and gc.collect() on every rank at the same step every "
    "N steps (Megatron's --manual-gc, NeMo's gc_interval). Else CPU contention (pin each rank to its own cores, "
    "enough cores per GPU, no other jobs on the node) or a slow read or log write on that rank's training thread.")

# straggler when one rank caused the waiting that costs, computing more in the steps it was late, though not the last
# in most steps (stragglers._extra_work_rank)
EXTRA_WORK_STRAGGLER_RECOMMENDATION = (
    "Rank {rank} holds the others at the collectives in the steps it is late, computing more than them there: work "
    "only it does in those steps (rank-0 evaluation, metrics or checkpoint bookkeeping on the GPU: run it every N "
    "steps on all ranks at once, or off the training step), more data than the others (a long sequence: pack or "
    "bucket by length), or its GPU running the same work slower from some step on (clocks and throttle reasons: "
    "nvidia-smi -q -d PERFORMANCE,CLOCK).")
# ... whose extra computation in those steps is its experts' extra tokens (stragglers.routed); {cause}: _routed_cause
LATE_STEPS_ROUTED_RECOMMENDATION = (
    "Rank {rank} holds the others at the collectives in the steps it is late, computing more than them there. {cause}")

# ... with what its extra computation in the steps it was late was (StragglerFacts.late_work), where that says
LATE_STEPS_WORK_TEXT = "In the steps it was late, its extra computation was most in {largest}."

# straggler when a group of ranks (or one) is late step after step, each the last in some steps
# (stragglers._slow_ranks): cause is SLOW_RANKS_DEVICE_CAUSE when they compute more in the steps they are late,
# else SLOW_RANKS_HOST_CAUSE
SLOW_RANKS_RECOMMENDATION = (
    "{who} arrived late at the collectives step after step, the last rank of a step changing among them by jitter "
    "only: slow hardware or hosts, not work that changes from step to step (ranks of one node, when they are that "
    "node's). {cause} If the node stays slow, exclude it from the job.")
SLOW_RANKS_DEVICE_CAUSE = (
    "The same work takes longer there: compare those GPUs' clocks and throttle reasons with the others' (nvidia-smi "
    "-q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE; rocm-smi), their links (PCIe/NVLink width and speed, the NIC) and "
    "ECC errors; or they get more work every step the same way (experts that stay hot, an uneven layer or data "
    "split): balance it.")
# ... and the cause a straggler's (or a slow group's) extra computation names, operation by operation against the
# other ranks (slow_work.WorkComparison.cause): the same operations on the same shapes slower ("device"), or work the
# others do less of ("work"); {who}: "rank 3", "ranks 4-7"
SAME_WORK_SLOWER_CAUSE = (
    "The same operations on the same shapes ran {slowdown:.2f}x slower on {who} than on the other ranks ({share:.0f} % "
    "of the extra computation): the GPU itself is slower there. Compare the clocks and throttle reasons there with "
    "the other ranks' (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE; rocm-smi --showperflevel --showpower "
    "--showtemp), the power cap and cooling, ECC and XID errors, and other processes on the GPU.")
MORE_WORK_CAUSE = (
    "{who} computed more than the other ranks: {share:.0f} % of the extra computation is work they do less of "
    "(most in {largest}). {fix}")
# load_imbalance whose late ranks' extra computation in the steps they were late (StragglerFacts.late_work) is work
# the others did less of ("work"): the work named, and its balancing by what it is (slow_work.work_kind)
LOAD_IMBALANCE_WORK_RECOMMENDATION = (
    "Ranks wait for each other at collectives, and the one they wait for changes from step to step: in the steps a "
    "rank was late, {share:.0f} % of its extra computation was work the others did less of (most in {largest}). "
    "{fix}")
# the {fix} of MORE_WORK_CAUSE and LOAD_IMBALANCE_WORK_RECOMMENDATION: balancing what the extra work is
# (slow_work.work_kind; "" where no one kind holds most of it)
BALANCE_BY_WORK_KIND = {
    "attention": "It is attention, whose cost grows with the square of each sequence's length: equal token counts "
                 "still leave unequal work. Balance the ranks' attention cost too (bucket sequences by length, a "
                 "sampler that balances the summed squared lengths), or cap the sequence length.",
    "experts": "It is the experts' products: the tokens routed to each rank's experts are unequal. Balance the "
               "routing (a load-balancing loss or a bias-based, aux-loss-free balancing), cap it (a capacity "
               "factor), or replicate the hot experts (EPLB).",
    "embeddings": "It is the embedding lookups: the tables' shards are unequal in the lookups they serve. Balance "
                  "the sharding plan by cost (lookups and pooling), not by rows (TorchRec's planner, row-wise or "
                  "column-wise sharding of the hot tables).",
    "": "Balance it: pack sequences to the same number of tokens per rank (or bucket them by length), a "
        "load-balancing loss or capacity factor for experts that stay hot, equal layers per pipeline stage (the "
        "first holds the embedding, the last the output layer and the loss), equal shards.",
}
# slow or late ranks that received more of the all-to-alls' data than the others (routing.RoutingEvidence: their extra
# tokens account for ROUTED_MIN_SHARE of their extra computation), where no recorded shapes compare their products:
# {who}: "Rank 3", "Ranks 4-7"; {when}: "a step" (slow step after step) or "in the steps it was late"; {what}:
# ROUTED_WHAT; followed by the BALANCE_BY_WORK_KIND of what the all-to-all carries
ROUTED_TOKENS_CAUSE = "{who} received {ratio:.2f}x the other ranks' all-to-all data {when}: {what}."
LOAD_IMBALANCE_ROUTED_RECOMMENDATION = (
    "Ranks wait for each other at collectives, and the one they wait for changes from step to step: in the steps a "
    "rank was late it received {ratio:.2f}x the other ranks' all-to-all data: {what}. {fix}")
# {what} of the two above, by what the extra computation is (slow_work.work_kind): the lookups sent to a sharded
# embedding table's rank (TorchRec's input distribution), else the tokens sent to an expert-parallel rank
ROUTED_WHAT = {
    "embeddings": "more lookups are sent to the embedding shards there (the input distribution's receive)",
    "experts": "more tokens are routed to the experts there (the dispatch's receive; the combine's is the same on "
               "every rank)"}
# ... whose late ranks ran the same work slower in the steps they were late ("device"): the GPUs' speed varies
LOAD_IMBALANCE_DEVICE_RECOMMENDATION = (
    "Ranks wait for each other at collectives, and the one they wait for changes from step to step, yet in the steps "
    "a rank was late it ran the same operations on the same shapes {slowdown:.2f}x slower than the others ({share:.0f} "
    "% of its extra computation): not more work, the GPUs' speed varies from step to step. Look at their clocks and "
    "throttle reasons over time (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER; a power or thermal cap shared by a node's "
    "GPUs, clocks that boost unevenly); locked clocks (nvidia-smi -lgc) trade a little peak for equal ranks.")
# a straggler late without more device work (or a CPU-only job's): what its training thread does beyond the other
# ranks' (stragglers._host_extra_text), appended to its fix
HOST_EXTRA_WORK_TEXT = "Its training thread's own time beyond the other ranks' is most in {largest}."
LATE_STEPS_HOST_WORK_TEXT = ("In the steps a rank was late, its training thread's own time beyond the other ranks' "
                             "was most in {largest}.")
NAMING_UNTRACED = ("That is Python the profiler did not record: name it with torch.profiler.record_function, or "
                   "profile with with_stack=True.")
# a straggler late at the collectives step after step whose extra computation names its cause (above)
STRAGGLER_CAUSE_RECOMMENDATION = "Rank {rank} holds the other ranks at the collectives step after step. {cause}"
SLOWER_GPU_EXCLUDE = "If it stays slow, exclude its node from the job."
# a CPU-only job's straggler whose training thread runs the same operators on the same shapes slower than the other
# ranks' (slow_work.host_work, cause "device"): its CPU, not its work
SAME_HOST_WORK_SLOWER_CAUSE = (
    "The same operators on the same shapes ran {slowdown:.2f}x slower on rank {rank}'s training thread than on the "
    "other ranks' ({share:.0f} % of its extra time): its CPU is slower there. Look for other processes or threads on "
    "its cores, ranks sharing a host with more threads between them than it has cores (torch.set_num_threads or "
    "OMP_NUM_THREADS at the cores per rank, each rank pinned to its own: taskset, numactl), its NUMA placement and "
    "the cores' frequency.")
# ... whose extra time is mostly work the other ranks do less of (cause "work")
HOST_MORE_WORK_CAUSE = (
    "Its training thread does more than the other ranks' ({share:.0f} % of its extra time is work they do less of): "
    "work only it does (rank-0 logging, metrics, evaluation or checkpoint bookkeeping: move it off the training "
    "thread, or do it every N steps on all ranks at once), or more data than the others (pack sequences to the same "
    "number of tokens per rank).")
SLOW_RANKS_HOST_CAUSE = (
    "They compute no more than the others but start late: their hosts are slower (CPU contention, other processes "
    "on the node, NUMA placement, fewer cores per GPU, a slower disk for their data).")


# gpu_analyses_skipped in a file cut before its end: the profiler writes the device's events after the host's
CUT_FILE_RECOMMENDATION = ("The trace file was cut before its end, and the profiler writes GPU events after the "
                           "host's operators: they may be in the part lost. Re-export the trace, or copy the whole "
                           "file, for the GPU analyses.")

RECOMMENDATIONS = {
    "data_loader_stall": "Feed the GPU faster: raise DataLoader num_workers, set pin_memory=True and "
                         "persistent_workers=True, prefetch (prefetch_factor) or move decoding/augmentation off "
                         "the training process.",
    "host_sync": "Remove host-device syncs inside the step: avoid .item()/.cpu()/print of tensors and "
                 "torch.cuda.synchronize() in the loop; log losses every N steps or asynchronously "
                 "(non_blocking copies to pinned memory).",
    "exposed_comm": "Overlap communication with computation: enable bucketing/prefetch (DDP bucket_cap_mb, "
                    "FSDP forward/backward prefetch), launch collectives on a side stream, or reduce volume "
                    "(gradient compression, larger micro-batches per all-reduce).",
    "comm_contention": "Computation runs slower while collectives run beside it: their kernels take SMs (NCCL's "
                       "and RCCL's CTAs) and memory bandwidth from the computation they hide behind. Give "
                       "communication fewer SMs where it stays hidden: cap its CTAs (NCCL_MAX_CTAS, or the "
                       "communicator's maxCTAs and its CTA policy NCCL_CTA_POLICY_EFFICIENCY; on ROCm RCCL's "
                       "NCCL_MAX_NCHANNELS; DeepEP's Buffer.set_num_sms), use collectives that need few or no SMs "
                       "(NVLink SHARP or copy-engine collectives on registered buffers, PyTorch's symmetric memory, "
                       "DeepEP's low-latency kernels with their hook-based overlap), or send fewer, larger "
                       "messages (larger DDP or FSDP buckets) so that less computation overlaps them; then profile "
                       "again: with fewer SMs each collective takes longer, which costs nothing only while it "
                       "stays hidden (the gain is an upper bound).",
    "pipeline_bubble": "The pipeline stage waits for its neighbours' activations and gradients: the schedule's "
                       "bubble, (p - 1) / (m + p - 1) of the step for GPipe and 1F1B with p stages and m "
                       "micro-batches per step. Run more micro-batches per step (smaller micro-batches, or more "
                       "gradient accumulation: m at least 4p), an interleaved schedule, which divides the bubble by "
                       "the model chunks per rank (Megatron --num-layers-per-virtual-pipeline-stage, "
                       "torch.distributed.pipelining ScheduleInterleaved1F1B), or a zero-bubble one "
                       "(ScheduleInterleavedZeroBubble, ZB-H1, DualPipe); use fewer stages where memory allows "
                       "(more data or tensor parallelism instead); and balance the stages' layers (the first holds "
                       "the embedding, the last the output layer and the loss).",
    "straggler": "Investigate the slow rank: its host/GPU (thermal throttling, noisy neighbour, slower link), "
                 "uneven data (sequence-length imbalance) or extra work only it does (logging, checkpointing).",
    "load_imbalance": "Ranks wait for each other at collectives, and the one they wait for changes from step to "
                      "step: the ranks get unequal work per step. Balance it: pack sequences to a fixed token count "
                      "per micro-batch (or group them by length), balance tokens across data-parallel ranks; in MoE, "
                      "an auxiliary load-balancing loss or a capacity factor; equal shards per rank.",
    "launch_bound": "The GPU waits for the CPU to launch kernels: capture the step with CUDA graphs, "
                    "torch.compile (mode='reduce-overhead') to fuse kernels, or raise the per-GPU batch size. "
                    + LAUNCH_BOUND_PROFILER_CHECK,
    "host_work": "The thread that launches the GPU's work spends milliseconds at a time on work that launches "
                 "nothing while the GPU idles (the longest gaps name the op around them): move it off the training "
                 "loop or do it less often. Metrics and logging every N steps or on a background thread; "
                 "preprocessing in DataLoader workers; a CPU-offloaded optimizer (ZeRO-Offload) overlapped with the "
                 "backward or kept on the GPU where memory allows; gc.freeze() after start-up and gc.collect() every "
                 "N steps for the garbage collector (the profiler's _ExperimentalConfig(record_python_gc_info=True), "
                 "PyTorch 2.9+, records its pauses beside the Python frames: gc_stall); profile with "
                 "with_stack=True where no op holds the time.",
    "small_kernels": "Many kernels are tiny: fuse them (torch.compile, fused optimizers, foreach ops) or use "
                     "CUDA graphs to cut per-launch overhead.",
    "memory_bound_unfused": "Elementwise and reduction kernels take a large share: fuse them (torch.compile, "
                            "fused LayerNorm/RMSNorm, fused activation and dropout, Liger/Triton kernels: "
                            "trainperf.kernels.apply(model) swaps fused RMSNorm, SwiGLU, RoPE and cross-entropy "
                            "into a Llama-style model).",
    "optimizer_slow": "The optimizer step is expensive: use the fused or foreach implementation "
                      "(torch.optim.AdamW(fused=True)), or shard optimizer state (ZeRO/FSDP).",
    "idle_with_work_queued": "The GPU idled with work already launched to it and nothing in the trace holding it: "
                             "something outside this process's trace did. Check for other processes on the GPU "
                             "(nvidia-smi / rocm-smi: a second job, a data-loading or evaluation process using CUDA, "
                             "MPS clients), streams waiting on events another process or device records (CUDA IPC, "
                             "peer copies) and the GPU's clocks and errors (nvidia-smi -q: throttling, Xid); profile "
                             "every process on the GPU together (nsys profile of each, or the system-wide trace).",
    "idle_gpu": "The GPU is idle for a large share of the window with no single cause found: look at the "
                "critical path in the report for the host work that gates it.",
    "checkpoint_stall": "Checkpoint saving blocks training: save asynchronously "
                        "(torch.distributed.checkpoint.async_save) or less often. A save every N steps costs each "
                        "step its time over N.",
    "compile_stall": "torch.compile compiles inside the profiled steps. In every step, a guard fails each time "
                     "and it recompiles (TORCH_LOGS=recompiles names the guard): mark the changing dimensions "
                     "dynamic (torch._dynamo.mark_dynamic, dynamic=True), pad or bucket shapes, and keep changing "
                     "Python values out of the compiled function. Only in the first steps, it is warm-up: "
                     "profile after it (a longer profiler schedule wait) and reuse compiled code across runs "
                     "(Inductor's FX graph cache).",
    "gc_stall": "Python's garbage collector pauses the training loop inside the steps (a full collection scans every "
                "live Python object: long with many of them, a dataset kept as Python lists or dicts, a large module "
                "tree). Call gc.freeze() once the model, optimizer and data are built, so that the objects of the "
                "start-up leave the collector's scans, and switch automatic collection off during training with a "
                "collection every N steps at the same point on every rank (gc.disable(); gc.collect(1) every N steps: "
                "torchtitan's training.gc_freq, Megatron-LM's --manual-gc --manual-gc-interval), so that no rank "
                "pauses in the middle of a step while the others wait for it at a collective.",
    "gpu_analyses_skipped": "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to record "
                            "GPU kernels.",
    "allocator_stall": "Device memory is allocated and freed through the driver (cudaMalloc/cudaFree, "
                       "hipMalloc/hipFree) inside the step, and cudaFree/hipFree synchronise the device: keep "
                       "the caching allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING / "
                       "PYTORCH_NO_HIP_MEMORY_CACHING), set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
                       "avoid torch.cuda.empty_cache() in the loop, and use fewer distinct tensor shapes "
                       "(pad or bucket sequence lengths).",
    "pageable_copy": "Copies between the device and pageable (unpinned) host memory block the host: pin the "
                     "host buffers (DataLoader(pin_memory=True) or tensor.pin_memory()), copy with "
                     ".to(device, non_blocking=True): the gain is priced so, each copy still on its stream at the "
                     "pinned rate (copy_time_pinned). Prefetching the next batch on a side stream can hide that too.",
    "fp32_matmul": "fp32 GEMMs/convolutions run without tensor cores: train in bf16 with "
                  "torch.autocast(device_type='cuda', dtype=torch.bfloat16) (fp16 + GradScaler where bf16 is absent, "
                  "e.g. V100), or keep fp32 weights and allow TF32: torch.backends.cuda.matmul.allow_tf32 = True / "
                  "torch.set_float32_matmul_precision('high'), torch.backends.cudnn.allow_tf32 = True.",
    "misaligned_gemm": "16-bit GEMMs whose row lengths are not multiples of 16 bytes (8 bf16/fp16 elements) run on "
                       "slower kernels: pad those dimensions to a multiple of 64 (the vocabulary of the output layer "
                       "and its embedding: GPT-2's 50,257 -> 50,304; the hidden and MLP sizes; the number of heads x "
                       "head dim), or at least of 8; for the token count (batch x sequence), a multiple of 8. An "
                       "operand that is a view of a wider tensor (a slice of a fused or padded weight) has that "
                       "tensor's row stride: make it .contiguous() once, or pad the wider tensor.",
    "slow_gemm": "GEMM shapes run at under half the rate tuned libraries reach for them on this part: let the "
                 "library pick kernels for the shapes (PYTORCH_TUNABLEOP_ENABLED=1, which tunes hipBLASLt/rocBLAS on "
                 "ROCm and cuBLASLt on CUDA; torch.compile(mode='max-autotune')), update it (ROCm, cuBLAS), give it "
                 "contiguous operands in the layout it takes (a transposed or strided view can fall back to a slower "
                 "kernel), and batch many small products into one (torch.bmm, a grouped GEMM for MoE experts).",
    "layout_transposes": "The convolution library converts NCHW tensors to NHWC and back around each convolution: keep "
                         "the model and its inputs in channels_last (model.to(memory_format=torch.channels_last), "
                         "inputs.to(memory_format=torch.channels_last)) so that the NHWC kernels run on them directly; "
                         "check that no custom op or .contiguous() call converts back. On ROCm, let MIOpen take NHWC "
                         "(PYTORCH_MIOPEN_SUGGEST_NHWC=1) or keep both in the layout its solver prefers.",
    "ddp_buffer_broadcast": "DistributedDataParallel broadcasts every buffer of the module from rank 0 before each "
                            "forward (broadcast_buffers=True, the default): flattened, broadcast, unflattened and "
                            "copied back one by one. Constant buffers (rotary tables, masks) need none of it: construct "
                            "DDP with broadcast_buffers=False. BatchNorm's running statistics then drift apart across "
                            "ranks, which only evaluation reads: broadcast them once before evaluating or saving "
                            "(torch.distributed.broadcast of each buffer), or use SyncBatchNorm where every step's "
                            "statistics must agree.",
    "ddp_gradient_copies": "DistributedDataParallel copies each parameter's reduced gradient out of its all-reduce "
                           "bucket into .grad after the backward (gradient_as_bucket_view=False, the default): "
                           "construct DDP with gradient_as_bucket_view=True, and the gradients are views of the "
                           "buckets: no copy, and the gradients' memory saved. Code that calls detach_() on a "
                           "gradient cannot (zero_grad(set_to_none=True), the default, is fine).",
    "ddp_unused_parameter_search": "DistributedDataParallel walks the whole autograd graph after every forward to "
                                   "find parameters that get no gradient (find_unused_parameters=True): where every "
                                   "parameter is used every step (DDP warns once when the search finds none), "
                                   "construct it with find_unused_parameters=False; where the unused ones are the same "
                                   "every step, static_graph=True searches once.",
    "graph_breaks": "torch.compile broke the model's graph inside the step: each break runs the code it could not "
                    "trace eagerly and compiles the rest as another graph, with its own guards and wrappers, forward "
                    "and backward, and nothing fused or captured across it. List the breaks and their causes with "
                    "TORCH_LOGS=\"graph_breaks\" (or torch._dynamo.explain(model)(*inputs)) and remove them: no "
                    ".item(), .tolist() or print in the forward, data-dependent Python branches as tensor ops "
                    "(torch.where, torch.cond), unsupported calls wrapped as custom ops "
                    "(torch.library.custom_op); compile with fullgraph=True to make any break an error.",
    "unbucketed_gradients": "Gradients are all-reduced one small message at a time: each pays a host call and the "
                            "collective's fixed latency, whatever its size. Bucket them: DistributedDataParallel "
                            "(bucket_cap_mb) or FSDP do; a hand-written loop should all-reduce one flattened buffer "
                            "(torch._utils._flatten_dense_tensors, then copy back) instead of each parameter's "
                            "gradient; a compiled backward that issues one collective per gradient, compile with DDP "
                            "(its reducer buckets them) rather than collectives written into the model.",
    "unfused_attention": "Use a fused attention kernel: torch.nn.functional.scaled_dot_product_attention (flash, "
                        "memory-efficient or cuDNN backend; is_causal=True rather than a dense mask), "
                        "attn_implementation='sdpa' or 'flash_attention_2' in Hugging Face models. Where SDPA "
                        "itself falls back to its math path (aten::_scaled_dot_product_attention_math), give it what "
                        "the fused kernels take: bf16/fp16 inputs, a head dim that is a multiple of 8 and at most "
                        "256, no unsupported mask.",
    "unfused_cross_entropy": "The loss runs its log-softmax and NLL as separate passes over the logits (tokens x "
                             "vocabulary), forward and backward: use a fused cross-entropy that reads the logits once and "
                             "writes their gradient in the same kernel (trainperf.kernels.CrossEntropyLoss, "
                             "Liger Kernel's LigerCrossEntropyLoss), or better a fused linear cross-entropy that never "
                             "holds the logits (trainperf.kernels.FusedLinearCrossEntropyLoss, Liger's "
                             "LigerFusedLinearCrossEntropyLoss): it also drops the fp32 cast and the shift's copy of "
                             "the logits, and the memory they free (logits_bytes each) buys a larger micro-batch. "
                             "torch.compile fuses the cast, log-softmax and NLL as well.",
    "devices_take_turns": "One process runs a model split across its GPUs one after another (Accelerate's "
                          "device_map=\"auto\", .to(\"cuda:1\") between layers: naive model parallelism), so each "
                          "GPU idles while the others work. Keep them busy together: for inference, serve with tensor "
                          "parallelism (vLLM or SGLang --tensor-parallel-size, DeepSpeed-Inference), or one model copy "
                          "per GPU where it fits in one; for training, one process per GPU (torchrun) with FSDP or "
                          "tensor parallelism, or a pipeline fed with micro-batches (torch.distributed.pipelining "
                          "ScheduleGPipe / Schedule1F1B, at least 4 micro-batches per stage).",
    "recompute_overhead": "Activation checkpointing re-runs the forward in the backward pass. Where memory allows, "
                         "recompute selectively: keep the matmul and attention outputs and recompute only cheap "
                         "elementwise/norm ops (torch.utils.checkpoint with create_selective_checkpoint_contexts, "
                         "torchtitan activation_checkpoint mode 'selective' (op), Megatron --recompute-granularity "
                         "selective), or checkpoint fewer layers; check the memory headroom first "
                         "(torch.cuda.max_memory_allocated against the device's memory).",
    "grad_sync_per_microbatch": "Gradient accumulation synchronises the gradients after every micro-batch: run "
                                "all backward passes but the last of each optimizer step without synchronising "
                                "(DDP: `with model.no_sync():`; FSDP2: model.set_requires_gradient_sync(False) "
                                "before them and True before the last; Accelerate: accelerator.accumulate(model)); "
                                "the last pass reduces the accumulated gradients once.",
    "exposed_memcpy": "Host-device copies hold up the device: prefetch them on a side stream with pinned memory and "
                     "non_blocking=True so they overlap computation (a CUDA stream + event per batch, or the "
                     "DataLoader's pin_memory with a prefetcher); with CPU offload (FSDP CPUOffload, DeepSpeed "
                     "ZeRO-Offload), offload less or overlap it (DeepSpeed overlap_comm, FSDP prefetch) where memory "
                     "allows.",
}

# late ranks (straggler) whose host paused, where their own named stalls of one cause in the steps they were late
# account for most of it (stragglers.paused_by): that stall's fix, with the share measured
_LATE_STALL = "The late ranks' own {what} in the steps they were late account for {{share:.0f}} % of their lateness: "
STALL_STRAGGLER_RECOMMENDATIONS = {
    "gc": _LATE_STALL.format(what="garbage collections") + "Python's garbage collector pauses each rank at its own "
          "moment, and the others wait for it at the next collective. " + RECOMMENDATIONS["gc_stall"],
    "dataloader": _LATE_STALL.format(what="DataLoader waits") + "their batches come slower than the other ranks' "
                  "(a slower disk or network share on their node, fewer CPU cores for their workers, larger or "
                  "costlier samples in their shard), and the others wait for them at the next collective. Give "
                  "their loaders more workers and prefetch (num_workers, prefetch_factor, persistent_workers), "
                  "stage the data on each node's local disk, and balance the shards' cost.",
    "checkpoint": _LATE_STALL.format(what="checkpoint saves") + "the ranks that save (rank 0 writing alone, or "
                  "ranks whose shards are larger) hold the others at the next collective. Save asynchronously "
                  "(torch.distributed.checkpoint.async_save) with every rank writing its shard, or less often.",
    "compile": _LATE_STALL.format(what="torch.compile compiles") + "ranks that recompile (a guard failing on a shape "
               "only their data has) hold the others at the next collective. Mark the changing dimensions dynamic "
               "(torch._dynamo.mark_dynamic), pad or bucket the shapes alike on every rank, and warm the compile "
               "cache before the profiled steps.",
}
