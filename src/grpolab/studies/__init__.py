"""The studies: runs of the verbs compared and reported (claims, compare, hacking, recipe), above the verbs they run."""
