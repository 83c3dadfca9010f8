"""What the command line lists, as plain data (written by scripts/write_catalog.py
from the registries; tests/test_cli.py checks it against them). The parser reads
`lmckit --help` from here, so asking for help imports no torch."""

MODELS = ("mlp", "vgg", "resnet20", "vit", "transformer", "gpt", "llama", "vgg11", "vgg16")
DATASETS = ("fashion-mnist", "mnist", "cifar10", "cifar100", "digits", "synthetic", "python-stdlib")
OPTIMIZERS = ("adam", "adamw", "sgd", "sophia", "sophia-l2")
SCHEDULES = ("constant", "warmup_linear")
SPLIT_KINDS = ("class-imbalanced", "dirichlet", "random")
EXECUTORS = ("local", "ray")
RECIPES = ("lmckit", "paper")
MATCHERS = {
    "wm": "weight matching, cold LAP solves (Git Re-Basin Alg. 1)",
    "wm-fast": "weight matching with dual warm starts (STE-MM Alg. 3); same optimum",
    "am": "activation matching on the correlation of units over the data",
    "am-ls": "activation matching in Git Re-Basin's least-squares form (§3.1 eq. 1): the "
    "cross-moment E[z_A z_Bᵀ]",
    "ste": "straight-through estimator of the midpoint loss (Git Re-Basin Alg. 2)",
    "sinkhorn": "Sinkhorn re-basin on the weight distance",
    "sinkhorn-mid": "Sinkhorn re-basin on the midpoint loss",
    "wm-orth": "weight matching with orthogonal maps (stream, heads) beside permutations; a "
    "transform of the norm-folded models",
    "wm-full": "weight matching over every symmetry the graph admits (orthogonal stream, "
    "invertible heads, ReLU scalings), those beyond rotations by least squares on "
    "activations; a transform of the norm-folded models",
    "am-orth": "activation matching (Procrustes, least squares) with orthogonal maps (stream, "
    "heads) beside permutations; a transform of the norm-folded models",
    "am-full": "activation matching (Procrustes, least squares) over every symmetry the graph "
    "admits (orthogonal stream, invertible heads, ReLU scalings); a transform of "
    "the norm-folded models",
    "ste-orth": "weight matching, then the midpoint loss by gradient descent on the maps, "
    "with orthogonal maps (stream, heads) beside permutations; a transform of the "
    "norm-folded models",
    "ste-full": "weight matching, then the midpoint loss by gradient descent on the maps, "
    "over every symmetry the graph admits (orthogonal stream, invertible heads, "
    "ReLU scalings); a transform of the norm-folded models",
}
MERGERS = {
    "average": "uniform average without alignment (every model weighted alike)",
    "fedavg": "one-shot FedAvg: average without alignment, each model weighted by the "
    "examples it trained on (McMahan et al.)",
    "star-wm": "weight-match every model to the reference, then average",
    "star-ste": "STE-match every model to the reference, then average",
    "star-wm-others": "star-WM, averaging the n-1 aligned non-reference models (STE-MM Fig. 1)",
    "star-ste-others": "star-STE, averaging the n-1 aligned non-reference models (STE-MM Fig. 1)",
    "merge-many": "re-match each model to the mean of the others (Git Re-Basin Alg. 3)",
    "merge-many-orth": "MergeMany over orthogonal maps too (transformers: the stream with its "
    "norms folded, each head's dimensions); a merge of the norm-folded "
    "models",
    "ste-mm": "multi-model straight-through estimator (STE-MM Alg. 1)",
    "ccmm": "cycle-consistent Frank–Wolfe over all pairwise distances",
}
