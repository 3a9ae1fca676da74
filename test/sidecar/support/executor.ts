/**
 * An executor process for the sidecar tests, killed by the test in the middle of a transfer.
 *
 *   executor.mjs send <socket> <id>   sends chunk 0 of stream <id> (4 MiB), then takes an 8 MiB
 *                                     slot for chunk 1, writes half of it and prints "holding"
 *   executor.mjs recv <socket> <id>   receives chunk 0 of <id>, prints "received <bytes> <sum>"
 *                                     and keeps it without marking it done
 *
 * Either way it then waits to be killed; it exits by itself after a minute in case nobody does.
 */
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"

const MiB = 1024 * 1024

const [scenario, socketPath, id] = process.argv.slice(2)
if (socketPath === undefined || id === undefined) throw new Error("usage: executor.mjs send|recv <socket> <id>")

const client = await SidecarClient.connect(socketPath)
if (scenario === "send") {
  const first = new Uint8Array(4 * MiB).map((_, i) => i % 251)
  await client.send(id, first, { to: [client.nodeId], chunk: 0, stream: true })
  const second = await client.allocate("float32", [2 * MiB])
  second.data.fill(1.5, 0, MiB)
  console.log("holding")
} else {
  const received = await client.recv(id)
  if (!(received instanceof Tensor)) throw new Error(`expected a tensor, got ${String(received)}`)
  const sum = received.bytes.reduce((total, byte) => total + byte, 0)
  console.log(`received ${received.byteLength} ${sum}`)
}
setTimeout(() => process.exit(1), 60_000)
