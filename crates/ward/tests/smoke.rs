use ward::{Arg, Isolation, Policy, RetType, Supervisor};

#[test]
fn adds_in_a_process_domain() {
    let sup = Supervisor::new(Policy::default());
    let path = ward_extensions::path_of("well").unwrap();
    let ext = sup.load_with(&path, Some(Isolation::Process)).unwrap();
    let v = ext.call("well_add", &mut [Arg::I64(2), Arg::I64(40)], RetType::I64).unwrap();
    assert_eq!(v.as_i64(), Some(42));
    let mut out = vec![0u8; 5];
    ext.call("well_xor", &mut [Arg::In(b"abcde"), Arg::Out(&mut out), Arg::U64(5), Arg::I64(1)], RetType::Void)
        .unwrap();
    assert_eq!(&out, b"`cbed");
}
