"""The Cloud TPU launcher behind `python launch/tpu_vm.py` (standard library only: it runs on
any machine with gcloud, where t5lite may not be installed).

Modules, lowest first (each imports only those above it):
  messages      LaunchError / CloudError, the notes on stderr, the "next command" lines
  layout        where the code and its venv live, here and on every worker
  slices        accelerator types: generation, size, hosts, default runtime
  retry         which cloud failures are worth another try; jittered exponential backoff
  stopmark      the stop marker stop-job / delete leave for a running supervise
  gcloud        the gcloud command runner (dry run, ssh / scp to the workers, bounded output,
                a watch while a job runs), ssh-agent check
  preflight     the workdir's bucket exists and is writable, before anything is rented
  vm            create / wait for / stop / start / delete / describe the TPU VM or queued resource
  data_ship     build datasets here, copy them to every worker's data dir (`data`, --data)
  worker_setup  ship the code and install Python + t5lite on every worker
  fit_check     `t5lite compile --json` for the slice here, before anything is rented or run
  job           the training job on the workers (launch/tpu_job.sh and its report lines)
  supervise     rerun create + setup + train after preemptions until the run's last step
  cli           the argument parser and main()
"""
