"""How a compile worker starts and runs, shared by every lane that is not the caller itself.

`worker` is a worker's loop (a job in, its outcome out, its calls to the caller sent back);
`worker_process` drives one worker from its parent; `template` and `template_process` keep one
warm interpreter, TileLang imported, that forks a fresh worker for every job (Android's zygote).
"""
