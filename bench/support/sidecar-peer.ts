/**
 * The processes on the far side of bench/sidecar.ts, driven over IPC (started with fork):
 *
 *   receiver <socket>   an executor: on { id, chunks } it asks for chunk 0 of <id>, answers
 *                       { listening }, receives chunks 0..chunks-1 marking each done, and answers
 *                       { id, doneAt } (process.hrtime in ns: the same monotonic clock as its parent's)
 *   tcp-source <bytes> <chunk bytes>
 *                       listens on 127.0.0.1, answers { port }, and writes <bytes> to each
 *                       connection, <chunk bytes> per write
 *   tcp-sink            on { port, mode } connects, reads to the end and answers { bytes, doneAt };
 *                       mode "data" reads the way Node does by default (a new 64 KiB buffer per
 *                       read), "onread" into one large buffer it names, as a sidecar reads chunks
 *
 * Each exits when its parent disconnects.
 */
import net from "node:net"
import { SidecarClient } from "../../src/sidecar/SidecarClient.js"

const send = (message: unknown) => process.send!(message)
const now = () => process.hrtime.bigint().toString()

process.once("disconnect", () => process.exit(0))

const [role, ...args] = process.argv.slice(2)

if (role === "receiver") {
  const client = await SidecarClient.connect(args[0]!)
  process.on("message", async ({ id, chunks }: { id: string; chunks: number }) => {
    // The first receive is asked for before the parent starts its clock.
    let next = client.recv(id, 0)
    send({ listening: id })
    for (let chunk = 0; chunk < chunks; chunk++) {
      if ((await next) === undefined) throw new Error(`chunk ${chunk} of ${id} is missing`)
      const last = chunk === chunks - 1
      if (last) send({ id, doneAt: now() })
      else next = client.recv(id, chunk + 1)
      await client.markDone(id, last ? undefined : chunk)
    }
  })
  send({ ready: true })
} else if (role === "tcp-source") {
  const [bytes, chunkBytes] = args.map(Number) as [number, number]
  const chunk = Buffer.alloc(chunkBytes, 7)
  const server = net.createServer((socket) => {
    let written = 0
    const pump = () => {
      while (written < bytes) {
        written += chunkBytes
        if (!socket.write(chunk)) return void socket.once("drain", pump)
      }
      socket.end()
    }
    pump()
  })
  server.listen(0, "127.0.0.1", () => send({ port: (server.address() as net.AddressInfo).port }))
} else if (role === "tcp-sink") {
  const large = Buffer.alloc(64 * 1024 * 1024)
  process.on("message", ({ port, mode }: { port: number; mode: "data" | "onread" }) => {
    let bytes = 0
    const count = (read: number) => {
      bytes += read
      return true
    }
    const socket =
      mode === "data"
        ? net.connect(port, "127.0.0.1").on("data", (data: Buffer) => count(data.length))
        : net.connect({
            port,
            host: "127.0.0.1",
            onread: { buffer: () => large.subarray(bytes % large.length), callback: count }
          })
    socket.on("end", () => send({ bytes, doneAt: now() }))
  })
  send({ ready: true })
} else {
  throw new Error(`unknown role ${role}`)
}
