# A stateful workload for checkpoint/restore tests; runs inside a test container.
# State that a fresh start cannot reproduce: a random token and a random buffer
# whose SHA-256 is recomputed from memory on every tick. Each tick rewrites
# /tmp/state with "token counter sha256"; restored, it must go on from there.
import hashlib
import os
import time

token = os.urandom(8).hex()
buffer = bytearray(os.urandom(16 << 20))
expected = hashlib.sha256(buffer).hexdigest()
counter = 0
while True:
    counter += 1
    digest = hashlib.sha256(buffer).hexdigest()
    with open("/tmp/state.new", "w") as state:
        state.write(f"{token} {counter} {digest if digest == expected else 'CORRUPT'}\n")
    os.replace("/tmp/state.new", "/tmp/state")
    time.sleep(0.1)
