"""One module per verb, each with its outer loop: train, sft, train-rm, iterative, eval, demo, agent demo."""
