"""The container engines: Docker's Engine API, or Podman's compatible one.

    client.py         the Engine API client over the engine's unix socket (bounded replies,
                      typed records), which the daemon and the cluster both use
    watcher.py        follows one engine's containers and Swarm services from a thread of
                      its own, and reports what it sees in membership's terms
    volume_driver.py  the `dqoes` volume driver: a ring per container, made through Docker
    followed.py       what dqoesd does with the engines, put together: the engine it follows
                      (Docker's or Podman's), the volume driver served to it, and the
                      engines asked for container names

Which objective a container's labels describe is membership's (membership/labels.py);
nothing in membership imports this package.
"""
