//! `delay_proxy TARGET_ADDR DELAY_MS`: run [`ferrofs_remote::delay_proxy::DelayProxy`] until
//! killed, printing its endpoint: latency added to a local S3 server for runs by hand.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(target), Some(ms)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: delay_proxy 127.0.0.1:PORT DELAY_MS");
        std::process::exit(2);
    };
    let target = target.parse().expect("TARGET_ADDR is host:port");
    let delay = std::time::Duration::from_millis(ms.parse().expect("DELAY_MS is a number"));
    let proxy = ferrofs_remote::delay_proxy::DelayProxy::start(target, delay).expect("proxy starts");
    println!("{}", proxy.endpoint());
    loop {
        std::thread::park();
    }
}
