// Node 20 lacks Promise.withResolvers, which js-libp2p 3 calls at start-up (Node 22 has it).
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function () {
    let resolve, reject
    const promise = new this((res, rej) => { resolve = res; reject = rej })
    return { promise, resolve, reject }
  }
}
